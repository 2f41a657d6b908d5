// Package staging keeps the pgoutput messages of transactions the source streams before their
// commit in a table of the target (pgconverge.stream_staging), for the stream to apply at their
// commit (cdc.Stager); and, for a transaction whose changes can be staged as rows (decoded ahead
// of the commit), those rows, in an UNLOGGED table per transaction and table of the target
// (pgconverge.stream_rows_…, apply.StreamedRows), which the commit merges set-based.
//
// Invariant: what a transaction staged is read back exactly as it was staged, in order, and
// nothing of it is visible in the replicated tables before its commit is applied; an abort deletes
// exactly what the transaction, or the subtransaction, staged (PostgreSQL docs §55.5 "Logical
// Streaming Replication Protocol").
package staging

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/cdc"
)

// Table is the staging of one slot in pgconverge.stream_staging, and the slot's row staging
// tables (rows.go), over a target connection of its own that only its writer's goroutine uses
// (writer.go).
type Table struct {
	conn *pgx.Conn
	slot string
	// mu guards rows: StreamedRows is called from the goroutine that applies a commit.
	mu sync.Mutex
	// rows are the row staging tables by transaction and table (quoted name).
	rows map[uint32]map[string]*apply.StreamedRows
	// next numbers the row staging tables of this session.
	next int
	buf  bytes.Buffer
	w    *writer
}

// New returns slot's staging over conn, a target connection the caller closes.
func New(conn *pgx.Conn, slot string) *Table {
	return &Table{conn: conn, slot: slot, rows: map[uint32]map[string]*apply.StreamedRows{}, w: newWriter()}
}

// Close waits for the queued COPYs and stops the goroutine that runs the statements; call it
// before closing the connection.
func (t *Table) Close() { t.w.close() }

// Flush returns once every row StageRows was given is written, or the first error of writing them.
func (t *Table) Flush(ctx context.Context) error { return t.w.run(ctx, func() error { return nil }) }

var _ cdc.Stager = (*Table)(nil)

// Clear deletes every row of the slot and drops its row staging tables, those of earlier sessions
// too (found by their names' prefix, rowsPrefix).
func (t *Table) Clear(ctx context.Context) error {
	return t.w.run(ctx, func() error { return t.clear(ctx) })
}

func (t *Table) clear(ctx context.Context) error {
	if _, err := t.conn.Exec(ctx, `delete from pgconverge.stream_staging where slot = $1`, t.slot); err != nil {
		return fmt.Errorf("clear the stream staging of slot %q: %w", t.slot, err)
	}
	names, err := t.leftRowTables(ctx)
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := t.conn.Exec(ctx, "drop table if exists "+n); err != nil {
			return fmt.Errorf("drop the row staging table %s of slot %q: %w", n, t.slot, err)
		}
	}
	t.mu.Lock()
	t.rows = map[uint32]map[string]*apply.StreamedRows{}
	t.mu.Unlock()
	return nil
}

// Stage copies msgs into the table (COPY) in one statement.
func (t *Table) Stage(ctx context.Context, msgs []cdc.StagedMessage) error {
	return t.w.run(ctx, func() error { return t.stage(ctx, msgs) })
}

func (t *Table) stage(ctx context.Context, msgs []cdc.StagedMessage) error {
	i := 0
	_, err := t.conn.CopyFrom(ctx, pgx.Identifier{"pgconverge", "stream_staging"}, []string{"slot", "xid", "seq", "subxid", "kind", "data"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i == len(msgs) {
				return nil, nil
			}
			m := msgs[i]
			i++
			return []any{t.slot, int64(m.Xid), m.Seq, int64(m.SubXid), m.Data[0], m.Data}, nil
		}))
	if err != nil {
		return fmt.Errorf("copy %d messages into the stream staging of slot %q: %w", len(msgs), t.slot, err)
	}
	return nil
}

// DiscardSub deletes the row changes (Insert, Update, Delete, Truncate and logical decoding
// messages) subtransaction subXid of xid staged; Relation and Type messages stay, since the
// source counts them as sent for the whole transaction.
func (t *Table) DiscardSub(ctx context.Context, xid, subXid uint32) error {
	return t.w.run(ctx, func() error { return t.discardSub(ctx, xid, subXid) })
}

func (t *Table) discardSub(ctx context.Context, xid, subXid uint32) error {
	_, err := t.conn.Exec(ctx, `delete from pgconverge.stream_staging where slot = $1 and xid = $2 and subxid = $3 and kind not in ('R', 'Y')`,
		t.slot, int64(xid), int64(subXid))
	if err != nil {
		return fmt.Errorf("discard the staged changes of subtransaction %d of transaction %d (slot %q): %w", subXid, xid, t.slot, err)
	}
	for _, sr := range t.StreamedRows(xid) {
		tag, err := t.conn.Exec(ctx, apply.DiscardStreamedSubSQL(sr.Name), int64(subXid))
		if err != nil {
			return fmt.Errorf("discard the staged rows of subtransaction %d of transaction %d (slot %q): %w", subXid, xid, t.slot, err)
		}
		t.mu.Lock()
		t.rows[xid][sr.Table.String()].Rows -= tag.RowsAffected()
		t.mu.Unlock()
	}
	return nil
}

// Discard deletes every row transaction xid staged.
func (t *Table) Discard(ctx context.Context, xid uint32) error {
	return t.w.run(ctx, func() error { return t.discard(ctx, xid) })
}

func (t *Table) discard(ctx context.Context, xid uint32) error {
	if _, err := t.conn.Exec(ctx, `delete from pgconverge.stream_staging where slot = $1 and xid = $2`, t.slot, int64(xid)); err != nil {
		return fmt.Errorf("discard the staged changes of transaction %d (slot %q): %w", xid, t.slot, err)
	}
	return t.discardRows(ctx, xid)
}

// Read returns up to limit messages of xid with seq above after, in seq order.
func (t *Table) Read(ctx context.Context, xid uint32, after int64, limit int) ([]cdc.StagedMessage, error) {
	var out []cdc.StagedMessage
	err := t.w.run(ctx, func() error {
		var err error
		out, err = t.read(ctx, xid, after, limit)
		return err
	})
	return out, err
}

func (t *Table) read(ctx context.Context, xid uint32, after int64, limit int) ([]cdc.StagedMessage, error) {
	rows, err := t.conn.Query(ctx, `select subxid, seq, data from pgconverge.stream_staging
where slot = $1 and xid = $2 and seq > $3 order by seq limit $4`, t.slot, int64(xid), after, limit)
	if err != nil {
		return nil, fmt.Errorf("read the stream staging of transaction %d (slot %q): %w", xid, t.slot, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cdc.StagedMessage, error) {
		m := cdc.StagedMessage{Xid: xid}
		var sub int64
		err := r.Scan(&sub, &m.Seq, &m.Data)
		m.SubXid = uint32(sub)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the stream staging of transaction %d (slot %q): %w", xid, t.slot, err)
	}
	return out, nil
}
