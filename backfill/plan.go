package backfill

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// condMark stands for the chunk's condition in Planner.query: a NUL, which no SQL text from the
// catalog holds, so a row filter before it can never be taken for it.
const condMark = "\x00chunk condition\x00"

// Planner cuts a table into chunks of about a fixed number of rows, in key order, by keyset
// pagination on the key's index inside one snapshot: each boundary is the key of the n-th row
// after the previous boundary. Only the key index is read, never the rows. A keyless table
// (changebatch.Table.Keyless) is one chunk. A block plan (NewBlockPlanner) cuts the table's
// file into ranges of blocks instead.
//
// Each boundary is read in its own short transaction that imports the snapshot, so the planner
// holds no lock on the table while it waits for workers to take its chunks: a TRUNCATE or ALTER
// TABLE on the source waits at most for one boundary query, and chunk readers queued behind it
// never wait for the planner.
type Planner struct {
	conn  *pgx.Conn
	snap  Snapshot
	t     changebatch.Table
	last  []string
	done  bool
	query string
	// keyless marks a keyless table (changebatch.Table.Keyless): one unbounded chunk.
	keyless bool
	// byBlock marks a block plan (NewBlockPlanner): chunks of step blocks from block next, of the
	// blocks the file had, cut from file node file.
	byBlock            bool
	next, step, blocks int64
	file               uint32
}

// NewPlanner prepares planning table t in snapshot snap over conn (a source connection not in a
// transaction, which the planner uses between calls of Next), with chunkRows rows per chunk, from
// the key after (nil: from the start).
func NewPlanner(conn *pgx.Conn, snap Snapshot, t changebatch.Table, chunkRows int, after []string) (*Planner, error) {
	if chunkRows <= 0 {
		return nil, fmt.Errorf("chunk size %d rows: must be positive", chunkRows)
	}
	if err := checkBounds(t, Chunk{Lower: after}); err != nil {
		return nil, err
	}
	if t.Keyless {
		// No key to cut it by: one chunk, read at one snapshot.
		return &Planner{conn: conn, snap: snap, t: t, keyless: true}, nil
	}
	names, _ := keyColumns(t)
	texts := make([]string, len(names))
	for i, n := range names {
		// An alias, so that ORDER BY names the column, not this text output of the same name.
		texts[i] = n + "::text as pgconverge_key_" + strconv.Itoa(i)
	}
	return &Planner{conn: conn, snap: snap, t: t, last: after,
		// The table's row filter is SQL text of its own (it may hold a %): the condition is
		// spliced in at condMark, never through a format string.
		query: "select " + strings.Join(texts, ", ") + " from " + t.SourceRelation("s") + " where " + condMark + " order by " +
			strings.Join(names, ", ") + " offset " + strconv.Itoa(chunkRows-1) + " limit 1"}, nil
}

// Next returns the next chunk and true, or false when the plan is complete. The last chunk is
// unbounded above.
func (p *Planner) Next(ctx context.Context) (Chunk, bool, error) {
	if p.done {
		return Chunk{}, false, nil
	}
	if p.keyless {
		p.done = true
		return Chunk{}, true, nil
	}
	if p.byBlock {
		return p.nextBlocks(), true, nil
	}
	tx, err := beginSnapshot(ctx, p.conn, p.snap)
	if err != nil {
		return Chunk{}, false, fmt.Errorf("plan chunks of %s: %w", p.t, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	cond, args := rangeCondition(p.t, Chunk{Lower: p.last})
	rows, err := tx.Query(ctx, strings.Replace(p.query, condMark, cond, 1), args...)
	if err != nil {
		return Chunk{}, false, fmt.Errorf("plan chunks of %s: %w", p.t, err)
	}
	var upper []string
	for rows.Next() {
		for _, raw := range rows.RawValues() {
			upper = append(upper, string(raw))
		}
	}
	if err := rows.Err(); err != nil {
		return Chunk{}, false, fmt.Errorf("plan chunks of %s: %w", p.t, err)
	}
	c := Chunk{Lower: p.last, Upper: upper}
	p.last = upper
	p.done = upper == nil
	return c, true, nil
}
