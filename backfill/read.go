package backfill

import (
	"context"
	"fmt"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// EmitFunc receives one batch of snapshot rows. The batch belongs to the caller of EmitFunc, who
// releases it after EmitFunc returns; an EmitFunc that keeps it must Retain it.
type EmitFunc func(ctx context.Context, rec arrow.RecordBatch) error

// MaxBatchBytes bounds the values of one emitted batch (64 MiB): wide rows make smaller batches,
// which keeps memory bounded and every Arrow string column far below its 2 GiB offset limit.
const MaxBatchBytes = 64 << 20

// ReadTable reads every row of table t that snapshot snap shows, over conn (an ordinary SQL
// connection to the source), and emits them as upsert batches of at most batchRows rows and about
// MaxBatchBytes bytes, each row at version (snap.LSN, 0). It returns the number of rows read. The read runs in a REPEATABLE READ,
// READ ONLY transaction that imports the snapshot; conn must not be in a transaction.
func ReadTable(ctx context.Context, conn *pgx.Conn, snap Snapshot, t changebatch.Table, batchRows int, emit EmitFunc) (int64, error) {
	if !snapshotName.MatchString(snap.Name) {
		return 0, fmt.Errorf("snapshot id %q is not a PostgreSQL snapshot id", snap.Name)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, fmt.Errorf("begin snapshot read of %s: %w", t, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "set transaction snapshot '"+snap.Name+"'"); err != nil {
		return 0, fmt.Errorf("import snapshot %s for %s: %w", snap.Name, t, err)
	}
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	rows, err := tx.Query(ctx, "select "+strings.Join(cols, ", ")+" from only "+t.Quoted(),
		pgx.QueryResultFormats{pgx.TextFormatCode})
	if err != nil {
		return 0, fmt.Errorf("read %s at snapshot %s: %w", t, snap.LSN, err)
	}
	defer rows.Close()
	b := changebatch.NewBuilder(memory.DefaultAllocator, t)
	defer b.Release()
	version := changebatch.Version{LSN: snap.LSN}
	vals := make([]changebatch.Value, len(t.Columns))
	var n int64
	flush := func() error {
		rec := b.NewBatch()
		defer rec.Release()
		return emit(ctx, rec)
	}
	for rows.Next() {
		for i, raw := range rows.RawValues() {
			if raw == nil {
				vals[i] = changebatch.Value{Null: true}
			} else {
				vals[i] = changebatch.Value{Text: string(raw)}
			}
		}
		b.Append(changebatch.Change{Op: changebatch.OpUpsert, Version: version, Values: vals})
		n++
		if b.Rows() >= batchRows || b.Bytes() >= MaxBatchBytes {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("read %s at snapshot %s: %w", t, snap.LSN, err)
	}
	if b.Rows() > 0 {
		if err := flush(); err != nil {
			return n, err
		}
	}
	return n, nil
}
