package verify

import (
	"context"
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/reconcile"
)

// RepairBatchRows is how many discrepancies (rows) one repair transaction takes.
const RepairBatchRows = 1000

// repairAll repairs the open discrepancies of every compared table from a fresh exact snapshot
// S', which it records in v.repairLSN.
func (v *verifyRun) repairAll(ctx context.Context) error {
	exp, err := backfill.Export(ctx, v.cfg.Source, v.cfg.Primary, pgsession.LogSlotWait(v.cfg.Logger))
	if err != nil {
		return err
	}
	defer exp.Close(context.WithoutCancel(ctx))
	v.repairLSN = exp.LSN
	applier := apply.New(v.tgt, nil)
	for _, t := range v.tables {
		if !t.ok() {
			continue
		}
		if err := v.repair(ctx, applier, exp.Snapshot, t); err != nil {
			return fmt.Errorf("repair %s: %w", t, err)
		}
	}
	return nil
}

// repair rewrites the keys of t's open discrepancies, a batch per target transaction: each key's
// row at snap as an upsert at (S', 0), or a tombstone at (S', 0) where snap has no row, through
// the apply step (so a newer streamed change still wins), and closes the batch's discrepancies in
// the same transaction: a repair killed and run again repairs nothing twice.
func (v *verifyRun) repair(ctx context.Context, applier *apply.Applier, snap backfill.Snapshot, t *verifyTable) error {
	keyCols := discrepancyKeyColumns(t.Table)
	after := ""
	for {
		open, err := coverage.OpenDiscrepancies(ctx, v.led, t.TableName, keyCols, after, RepairBatchRows)
		if err != nil || len(open) == 0 {
			return err
		}
		if after == "" {
			// The repair writes the target: its memo is dropped (the rows written would show as
			// changed anyway).
			if err := v.dropMemo(ctx, t.Table); err != nil {
				return err
			}
		}
		after = open[len(open)-1].ID
		n, err := v.repairBatch(ctx, applier, snap, t, open)
		if err != nil {
			return err
		}
		t.rep.Repaired += n
		v.cfg.Monitor.DiscrepanciesRepaired(t.rep.Table, n)
	}
}

// repairBatch repairs and closes the discrepancies open in one target transaction and returns how
// many it closed.
func (v *verifyRun) repairBatch(ctx context.Context, applier *apply.Applier, snap backfill.Snapshot, t *verifyTable, open []coverage.OpenDiscrepancy) (int64, error) {
	keys := make([][]string, len(open))
	ids := make([]string, len(open))
	for i, d := range open {
		keys[i], ids[i] = d.Key, d.ID
	}
	tx, err := applier.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if t.Keyless {
		err = v.repairValues(ctx, tx, snap, t, keys)
	} else {
		_, _, err = writeKeys(ctx, v.src, tx, snap, t.Table, keys)
	}
	if err != nil {
		return 0, err
	}
	n, err := coverage.CloseDiscrepancies(ctx, tx.Conn(), ids, coverage.RemediationRepaired, snap.LSN)
	if err != nil {
		return 0, err
	}
	if k := v.cfg.BeforeRepairCommit; k != nil {
		k(t.String())
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return n, nil
}

// writeKeys writes, in tx, each key of table t as snap has it, through the apply step at version
// (S, 0): its row read over src at snap, or a tombstone where snap has none. It returns the target
// rows written (apply.Result.Applied) and, of them, the tombstones.
func writeKeys(ctx context.Context, src *pgx.Conn, tx *apply.Tx, snap backfill.Snapshot, t changebatch.Table, keys [][]string) (written, tombstones int64, err error) {
	found, err := backfill.ReadKeys(ctx, src, snap, t, keys, func(ctx context.Context, rec arrow.RecordBatch) error {
		r, err := tx.ApplySnapshot(ctx, rec)
		written += r.Applied
		return err
	})
	if err != nil {
		return written, 0, err
	}
	if del := backfill.Tombstones(t, snap.LSN, keys, found); del != nil {
		r, err := tx.Apply(ctx, del)
		del.Release()
		tombstones = r.Applied
		return written + tombstones, tombstones, err
	}
	return written, 0, nil
}

// repairValues sets, in tx, the copies of each row value of keyless table t named by keys
// (reconcile.ValueKeySQL) to the copies snap shows: the target's entries of those values older
// than S' are replaced, and snap's rows of them are written at (S', 0) through the apply step,
// which leaves them to the deletes the stream already applied after S'.
func (v *verifyRun) repairValues(ctx context.Context, tx *apply.Tx, snap backfill.Snapshot, t *verifyTable, keys [][]string) error {
	vals := make([]string, len(keys))
	for i, k := range keys {
		vals[i] = k[0]
	}
	// The source's rows are read first (a scan of the whole table): the target table's writers
	// take turns, and the stream must not wait for the scan.
	var recs []arrow.RecordBatch
	defer func() {
		for _, rec := range recs {
			rec.Release()
		}
	}()
	_, err := backfill.ReadValues(ctx, v.src, snap, t.Table, reconcile.ValueKeySQL(v.mode, t.Table, "")+" = any($1::text[])", []any{vals},
		func(ctx context.Context, rec arrow.RecordBatch) error {
			rec.Retain()
			recs = append(recs, rec)
			return nil
		})
	if err != nil {
		return err
	}
	ver := changebatch.Version{LSN: snap.LSN}
	if _, err := tx.SupersedeKeyless(ctx, t.Table, ver, reconcile.ValueKeySQL(v.mode, t.Table, "e.")+" = any($2::text[])", vals); err != nil {
		return err
	}
	for _, rec := range recs {
		if _, err := tx.ApplySnapshot(ctx, rec); err != nil {
			return err
		}
	}
	return nil
}
