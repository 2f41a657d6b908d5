package backfill

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// A bulk load (a target table that holds no row and that no stream follows) reads the source
// table by ranges of its blocks instead of its key: each chunk is the rows stored in blocks
// [Lower, Upper) of the table's file, read with the planner's TID range scan (PostgreSQL 14 and
// later; a tuple id is (block, offset), PostgreSQL docs §73.6 "Database Page Layout"),
// sequentially and without the key index. One snapshot shows each row in one
// block, so the chunks of one snapshot hold every row exactly once, whatever the key; rows are
// read in no particular order, which the bulk load's COPY into a table without its key does not
// need. For pgbench_accounts this costs the source about two thirds of the ordered index scan,
// and on a table whose rows are not stored in key order it saves a random read per row.
//
// Between snapshots, rows do move between blocks: an interrupted block plan is resumed at a new
// snapshot as a key plan's is (its completed chunks kept, the rest read again), and a row that an
// update moved into a completed chunk's blocks after that chunk's snapshot reaches the target
// through the stream, as any change after a kept chunk's snapshot does. A rewrite of the source
// table (VACUUM FULL, CLUSTER, a rewriting ALTER TABLE) moves every row without a change to
// stream: the plan records the file it cut (Planner.SourceFile), and one cut from another file is
// never resumed.

// BlockPlanColumns returns what a block plan records in place of the key columns a key plan is cut
// by: ctid, which no column of a table can be named.
func BlockPlanColumns() []string { return []string{"ctid"} }

// sampleBlocks is how many of the first blocks of a table without statistics (pg_class.reltuples
// or relpages unknown: never analyzed) are counted to tell its rows per block.
const sampleBlocks = 16

// BlockPlanOK reports whether table t can be read by block ranges over conn, a source
// connection: t is keyed, not partitioned (its partitions are files of their own) and read
// without a row filter, and the source runs PostgreSQL 14 or later (TID range scans).
func BlockPlanOK(conn *pgx.Conn, t changebatch.Table) bool {
	return pgsession.MajorVersion(conn.PgConn()) >= 14 && !t.Keyless && !t.Partitioned && t.RowFilter == ""
}

// NewBlockPlanner prepares cutting table t (BlockPlanOK) into block ranges of about chunkRows
// rows each, by the size of t's file and its rows per block (pg_class.reltuples / relpages, or,
// for a table never analyzed, the rows of its first sampleBlocks blocks) read in snapshot snap
// over conn (a source connection not in a transaction), from block after[0]
// (nil: from block 0). The last chunk is unbounded above: it also holds rows of blocks added
// since. SourceFile returns the file node the plan cut.
func NewBlockPlanner(ctx context.Context, conn *pgx.Conn, snap Snapshot, t changebatch.Table, chunkRows int, after []string) (*Planner, error) {
	if chunkRows <= 0 {
		return nil, fmt.Errorf("chunk size %d rows: must be positive", chunkRows)
	}
	if !BlockPlanOK(conn, t) {
		return nil, fmt.Errorf("plan %s by block ranges: only a plain keyed table without a row filter on PostgreSQL 14 or later can be", t)
	}
	p := &Planner{conn: conn, snap: snap, t: t, byBlock: true}
	if after != nil {
		b, err := parseBlock(after)
		if err != nil {
			return nil, fmt.Errorf("resume the block plan of %s: %w", t, err)
		}
		p.next = b
	}
	tx, err := beginSnapshot(ctx, conn, snap)
	if err != nil {
		return nil, fmt.Errorf("plan chunks of %s: %w", t, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := checkNotRewritten(ctx, tx, t, snap); err != nil {
		return nil, err
	}
	var rowsPerBlock float64
	err = tx.QueryRow(ctx, `select pg_relation_size(oid) / current_setting('block_size')::bigint, relfilenode,
  case when reltuples > 0 and relpages > 0 then reltuples / relpages else 0 end
from pg_class where oid = $1::regclass`, t.Quoted()).Scan(&p.blocks, &p.file, &rowsPerBlock)
	if err != nil {
		return nil, fmt.Errorf("plan chunks of %s: read its size: %w", t, err)
	}
	if rowsPerBlock <= 0 && p.blocks > 0 {
		// No statistics: count the rows the snapshot shows in the first blocks.
		sample := min(p.blocks, sampleBlocks)
		var rows int64
		err := tx.QueryRow(ctx, "select count(*) from only "+t.Quoted()+" where ctid < $1::tid", "("+strconv.FormatInt(sample, 10)+",0)").Scan(&rows)
		if err != nil {
			return nil, fmt.Errorf("plan chunks of %s: count the rows of its first blocks: %w", t, err)
		}
		rowsPerBlock = float64(rows) / float64(sample)
	}
	if rowsPerBlock <= 0 {
		rowsPerBlock = 1 // empty so far: chunks as large as the rows they could hold
	}
	p.step = max(int64(float64(chunkRows)/rowsPerBlock), 1)
	return p, nil
}

// SourceFile returns the source table's file node (pg_class.relfilenode) a block plan was cut
// from, 0 for a key plan.
func (p *Planner) SourceFile() uint32 { return p.file }

// nextBlocks returns the next chunk of a block plan.
func (p *Planner) nextBlocks() Chunk {
	c := Chunk{ByBlock: true, Lower: []string{strconv.FormatInt(p.next, 10)}}
	// A rest of less than half a chunk joins the last chunk.
	if p.next+p.step+p.step/2 >= p.blocks {
		p.done = true
		return c
	}
	p.next += p.step
	c.Upper = []string{strconv.FormatInt(p.next, 10)}
	return c
}

// parseBlock returns the block number a block chunk's bound holds.
func parseBlock(bound []string) (int64, error) {
	if len(bound) != 1 {
		return 0, fmt.Errorf("block bound %q: want one block number", bound)
	}
	b, err := strconv.ParseUint(bound[0], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("block bound %q: want a block number", bound[0])
	}
	return int64(b), nil
}

// blockCondition returns block chunk c's range as a condition on ctid, each bound written as
// value renders it (a parameter or a literal), cast to tid: block b is the tuple id (b,0), below
// every row of the block.
func blockCondition(c Chunk, value func(string) string) string {
	cond := "ctid >= " + value("("+c.Lower[0]+",0)") + "::tid"
	if c.Upper != nil {
		cond += " and ctid < " + value("("+c.Upper[0]+",0)") + "::tid"
	}
	return cond
}

// SourceFile returns table t's current file node on the source (pg_class.relfilenode) over conn,
// to compare with the one an interrupted block plan was cut from.
func SourceFile(ctx context.Context, conn *pgx.Conn, t changebatch.Table) (uint32, error) {
	var file uint32
	if err := conn.QueryRow(ctx, `select relfilenode from pg_class where oid = $1::regclass`, t.Quoted()).Scan(&file); err != nil {
		return 0, fmt.Errorf("read the file node of %s on the source: %w", t, err)
	}
	return file, nil
}
