package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/advisory"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/verify"
)

// repairGaps repairs the gapped tables by comparison (--on-gap=repair, verify.RepairGap) at
// snap, or, when snap is nil, at an exact snapshot of a temporary slot it exports (the session's
// stream then starts at or before its LSN), in one gap-repair run of the ledger. Each table is
// repaired under its backfill lock, waiting for another process's backfill of it to end. It
// returns the tables it cannot compare (verify.ErrNotComparable: no key, partitioned, a target
// table without a source column), each logged with the reason, for the caller to backfill. Its
// statements have no deadline (a comparison reads the whole table).
func (s *session) repairGaps(ctx context.Context, tables []changebatch.Table, snap *backfill.Snapshot) (rest []changebatch.Table, err error) {
	cfg := s.cfg
	ctx = pgsession.Unbound(ctx)
	ctrl, err := pgsession.Connect(ctx, cfg.Target, "target")
	if err != nil {
		return nil, err
	}
	defer ctrl.Close(context.WithoutCancel(ctx))
	// The backfill locks are released now: a closed session's locks outlive it until its backend
	// exits, which the backfill of the tables not repaired must not wait for.
	defer ctrl.Exec(context.WithoutCancel(ctx), `select `+advisory.UnlockAll)
	if snap == nil {
		exp, err := backfill.Export(ctx, cfg.Source, cfg.Primary, pgsession.LogSlotWait(cfg.Logger))
		if err != nil {
			return nil, err
		}
		defer exp.Close(context.WithoutCancel(ctx)) // drops the temporary slot
		snap = &exp.Snapshot
	}
	runID, err := coverage.StartRun(ctx, ctrl, coverage.TriggerGapRepair, cfg.Slot, 1, cfg.ChunkRows)
	if err != nil {
		return nil, err
	}
	var written int64
	defer func() {
		if endErr := coverage.EndRun(context.WithoutCancel(ctx), ctrl, runID, written, 0, err); err == nil {
			err = endErr
		}
	}()
	cfg.Logger.Info("gap repair started: comparing each table at the snapshot and writing the keys that differ",
		"run", runID, "snapshot_lsn", snap.LSN.String(), "tables", len(tables))
	for _, t := range tables {
		if _, err := coverage.LockBackfill(ctx, ctrl, t.TableName, true); err != nil {
			return nil, err
		}
		res, err := verify.RepairGap(ctx, verify.GapJob{Source: cfg.Source, Target: cfg.Target, Table: t, Snapshot: *snap,
			RunID: runID, Slot: cfg.Slot, Epoch: s.epoch, SourceID: s.sourceID, CopyOnly: cfg.copyOnly,
			BeforeBatch: cfg.Knobs.BeforeGapRepairBatch})
		written += res.Written
		if errors.Is(err, verify.ErrNotComparable) {
			cfg.Logger.Warn("gap repair: backfilling the table instead", "table", t.String(), "reason", err.Error())
			rest = append(rest, t)
		} else if err != nil {
			return nil, fmt.Errorf("gap repair of %s at snapshot %s (run %d): %w", t, snap.LSN, runID, err)
		} else {
			s.mon.GapRepaired(t.String(), res.Compared, res.Written)
			cfg.Logger.Info("gap repaired by comparison", "table", t.String(), "run", runID, "snapshot_lsn", snap.LSN.String(),
				"rows_compared", res.Compared, "keys_differing", res.Differing, "rows_written", res.Written,
				"tombstones", res.Tombstones, "moved_on", res.Moved, "seconds", fmt.Sprintf("%.1f", res.Elapsed.Seconds()))
		}
		if err := coverage.UnlockBackfill(ctx, ctrl, t.TableName); err != nil {
			return nil, err
		}
	}
	return rest, nil
}
