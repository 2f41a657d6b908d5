package backfill

import (
	"context"
	"fmt"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/disposition"
)

// EmitFunc receives one batch of snapshot rows. The batch belongs to the caller of EmitFunc, who
// releases it after EmitFunc returns; an EmitFunc that keeps it must Retain it.
type EmitFunc func(ctx context.Context, rec arrow.RecordBatch) error

// MaxBatchBytes bounds the values of one emitted batch (16 MiB): wide rows make smaller batches,
// which keeps memory bounded and every Arrow string column far below its 2 GiB offset limit.
const MaxBatchBytes = 16 << 20

// ErrRewritten is returned by ReadChunk when the table's storage was replaced after the snapshot
// was taken: a table-rewriting ALTER TABLE, TRUNCATE, VACUUM FULL or CLUSTER. Some of these are
// not MVCC-safe (PostgreSQL docs §13.6, "Caveats"): the snapshot would see the table empty, and a
// backfill that took that for the truth would tombstone every row it did not read. The run's
// table backfills are abandoned; a backfill run again starts them over from a new snapshot (the
// daemon backs off, reason "schema").
var ErrRewritten = disposition.New("table rewritten since the snapshot", disposition.Mark{Action: disposition.BackOff, Reason: disposition.ReasonSchema})

// checkNotRewritten locks t against rewrites for the rest of tx (ACCESS SHARE, as the read takes
// anyway) and returns an error wrapping ErrRewritten when t's file node is no longer the one the
// snapshot's catalog shows; for a partitioned table, when its partitions changed
// (checkPartitionsUnchanged).
func checkNotRewritten(ctx context.Context, tx pgx.Tx, t changebatch.Table, snap Snapshot) error {
	if t.Partitioned {
		if err := checkPartitionsUnchanged(ctx, tx, t, snap); err != nil {
			return err
		}
		return checkColumns(ctx, tx, t)
	}
	if _, err := tx.Exec(ctx, "lock table only "+t.Quoted()+" in access share mode"); err != nil {
		return fmt.Errorf("lock %s for reading: %w", t, err)
	}
	if err := checkColumns(ctx, tx, t); err != nil {
		return err
	}
	var same bool
	err := tx.QueryRow(ctx, `select relfilenode = pg_relation_filenode(oid) from pg_class where oid = $1::regclass`, t.Quoted()).Scan(&same)
	if err != nil {
		return fmt.Errorf("check the storage of %s: %w", t, err)
	}
	if !same {
		return fmt.Errorf("%w: %s was rewritten or truncated on the source after snapshot %s (ALTER TABLE that rewrites it, TRUNCATE, VACUUM FULL or CLUSTER), so the snapshot cannot show its rows; run the backfill again: it starts the table over from a new snapshot",
			ErrRewritten, t, snap.LSN)
	}
	return nil
}

// checkColumns returns an error wrapping ErrRewritten when t's columns (names, attnums, types) on
// the source are not the ones described: a column added since the description (ADD COLUMN with a
// constant default rewrites nothing) would be missing from the rows read; with a column list
// (t.ColumnList) only the listed columns count. Called with t locked.
func checkColumns(ctx context.Context, tx pgx.Tx, t changebatch.Table) error {
	rows, err := tx.Query(ctx, `select attname, atttypid, atttypmod, attnum from pg_attribute
where attrelid = $1::regclass and attnum > 0 and not attisdropped and attgenerated = '' order by attnum`, t.Quoted())
	if err != nil {
		return fmt.Errorf("check the columns of %s: %w", t, err)
	}
	var got []changebatch.Column
	for rows.Next() {
		var c changebatch.Column
		if err := rows.Scan(&c.Name, &c.TypeOID, &c.TypeMod, &c.Attnum); err != nil {
			rows.Close()
			return fmt.Errorf("check the columns of %s: %w", t, err)
		}
		if t.ColumnList && t.ColumnIndex(c.Name) < 0 {
			continue // not published: not read
		}
		got = append(got, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check the columns of %s: %w", t, err)
	}
	same := len(got) == len(t.Columns)
	for i := 0; same && i < len(got); i++ {
		d := t.Columns[i]
		same = got[i].Name == d.Name && (d.Attnum == 0 || got[i].Attnum == d.Attnum) &&
			(d.TypeOID == 0 || got[i].TypeOID == d.TypeOID && got[i].TypeMod == d.TypeMod)
	}
	if !same {
		return fmt.Errorf("%w: the columns of %s changed on the source since it was described, so the rows read would lack or mistype some; run the backfill again: it describes the table again and starts it over",
			ErrRewritten, t)
	}
	return nil
}

// ReadChunk reads every row of chunk c of table t that snapshot snap shows, in key order (a block
// chunk's in no particular order), over
// conn (an ordinary SQL connection to the source, not in a transaction), and emits them as upsert
// batches of at most batchRows rows and about MaxBatchBytes bytes, each row at version
// (snap.LSN, 0). It returns the number of rows read. The read runs in its own REPEATABLE READ,
// READ ONLY transaction that imports the snapshot.
func ReadChunk(ctx context.Context, conn *pgx.Conn, snap Snapshot, t changebatch.Table, c Chunk, batchRows int, emit EmitFunc) (int64, error) {
	tx, err := beginChunk(ctx, conn, snap, t, c)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	cond, args := rangeCondition(t, c)
	query := chunkQuery(t, cond, c)
	if t.Keyless {
		cols := make([]string, len(t.Columns))
		for i, c := range t.Columns {
			cols[i] = pgx.Identifier{c.Name}.Sanitize()
		}
		query = keylessQuery(t, cols)
	}
	rows, err := tx.Query(ctx, query, append([]any{pgx.QueryResultFormats{pgx.TextFormatCode}}, args...)...)
	if err != nil {
		return 0, fmt.Errorf("read chunk %s of %s at snapshot %s: %w", c, t, snap.LSN, err)
	}
	defer rows.Close()
	w := newBatcher(t, snap, batchRows, emit)
	defer w.release()
	var n int64
	for rows.Next() {
		if err := w.add(ctx, rows.RawValues()); err != nil {
			return n, err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("read chunk %s of %s at snapshot %s: %w", c, t, snap.LSN, err)
	}
	if t.Partitioned {
		// A partition attached after the first check may have been scanned.
		if err := checkPartitionsUnchanged(ctx, tx, t, snap); err != nil {
			return n, err
		}
	}
	return n, w.flush(ctx)
}

// beginChunk checks c's bounds against t's key and starts the snapshot transaction that reads
// it, with t locked against rewrites and checked unchanged since the snapshot (checkNotRewritten).
func beginChunk(ctx context.Context, conn *pgx.Conn, snap Snapshot, t changebatch.Table, c Chunk) (pgx.Tx, error) {
	if err := checkBounds(t, c); err != nil {
		return nil, err
	}
	tx, err := beginSnapshot(ctx, conn, snap)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", t, err)
	}
	if err := checkNotRewritten(ctx, tx, t, snap); err != nil {
		tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return tx, nil
}

// ReadValues reads the rows of keyless table t (changebatch.Table.Keyless) that satisfy cond (SQL
// over the table's columns, unqualified; its arguments args numbered from $1) and that snapshot
// snap shows, over conn (a source connection not in a transaction), and emits them as snapshot
// rows at (snap.LSN, 0) with their ctid as occurrence, as ReadChunk does. It returns how many it
// read. The read scans the whole table.
func ReadValues(ctx context.Context, conn *pgx.Conn, snap Snapshot, t changebatch.Table, cond string, args []any, emit EmitFunc) (int64, error) {
	if !t.Keyless {
		return 0, fmt.Errorf("read values of %s: it has a key (ReadKeys)", t)
	}
	tx, err := BeginSnapshot(ctx, conn, snap, t)
	if err != nil {
		return 0, fmt.Errorf("read values of %s: %w", t, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	q := "select * from (" + keylessQuery(t, cols) + ") s where " + cond
	rows, err := tx.Query(ctx, q, append([]any{pgx.QueryResultFormats{pgx.TextFormatCode}}, args...)...)
	if err != nil {
		return 0, fmt.Errorf("read values of %s at snapshot %s: %w", t, snap.LSN, err)
	}
	defer rows.Close()
	w := newBatcher(t, snap, 1000, emit)
	defer w.release()
	var n int64
	for rows.Next() {
		if err := w.add(ctx, rows.RawValues()); err != nil {
			return n, err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("read values of %s at snapshot %s: %w", t, snap.LSN, err)
	}
	return n, w.flush(ctx)
}

// keylessQuery returns the read of a keyless table (changebatch.Table.Keyless), one chunk of the
// whole table: every row with its ctid first, which tells the rows of one value apart within the
// snapshot (the read's order does not matter).
func keylessQuery(t changebatch.Table, cols []string) string {
	q := "select ctid::text, " + strings.Join(cols, ", ") + " from only " + t.Quoted()
	if t.RowFilter != "" {
		q += " where (" + t.RowFilter + ")"
	}
	return q
}

// parseCTID turns a tuple id as PostgreSQL prints it, "(block,offset)", into block<<16 | offset
// (an offset is below 2^16: PostgreSQL docs §73.6 "Database Page Layout").
func parseCTID(raw []byte) (uint64, error) {
	var block, offset uint64
	if _, err := fmt.Sscanf(string(raw), "(%d,%d)", &block, &offset); err != nil || offset >= 1<<16 {
		return 0, fmt.Errorf("row id %q is not a tuple id", raw)
	}
	return block<<16 | offset, nil
}
