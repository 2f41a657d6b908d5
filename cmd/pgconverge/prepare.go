package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"golang.org/x/sync/errgroup"
)

// prepareSlot makes sure the slot exists and every table is loaded, and returns the LSN to start
// streaming from. A new slot's own exported snapshot loads every table; with an existing slot,
// tables that have no completed load followed by this slot load from a fresh snapshot of a
// temporary slot, while the main slot keeps their later changes.
func (s *session) prepareSlot(ctx context.Context) (pglogrepl.LSN, error) {
	cfg := s.cfg
	slot, err := cdc.ReadSlot(ctx, s.src, cfg.Slot)
	if err != nil {
		return 0, err
	}
	if !slot.Exists {
		created, err := pgsession.CreateSlot(ctx, s.repl, cfg.Slot, false)
		if err != nil {
			return 0, err
		}
		cfg.Logger.Info("created replication slot", "slot", cfg.Slot, "consistent_point", created.ConsistentPoint.String())
		tx, err := s.ap.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if err := apply.StartSlot(ctx, tx.Conn(), cfg.Slot, created.ConsistentPoint); err != nil {
			return 0, err
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, err
		}
		snap := backfill.Snapshot{Name: created.SnapshotName, LSN: created.ConsistentPoint}
		return created.ConsistentPoint, s.loadTables(ctx, s.tables, snap)
	}
	if err := slot.Usable(cfg.Slot, s.src.Config().Database); err != nil {
		return 0, permanent(err)
	}
	if err := slot.Busy(cfg.Slot); err != nil {
		return 0, err
	}
	progress, known, err := apply.ReadProgress(ctx, s.tgt, cfg.Slot)
	if err != nil {
		return 0, err
	}
	loaded, err := apply.LoadedTables(ctx, s.tgt, cfg.Slot)
	if err != nil {
		return 0, err
	}
	switch {
	case !known:
		cfg.Logger.Warn("the target has no progress for the existing slot: loading every table from a new snapshot",
			"slot", cfg.Slot, "confirmed_flush_lsn", slot.ConfirmedFlush.String())
		loaded = nil
		progress = slot.ConfirmedFlush
		if err := s.recordProgress(ctx, progress); err != nil {
			return 0, err
		}
	case progress < slot.ConfirmedFlush:
		return 0, permanent(fmt.Errorf("slot %q has confirmed_flush_lsn %s, ahead of the target's progress %s: another client consumed changes from this slot, or the target was restored from an older backup, so changes in between are missing; drop the slot (SELECT pg_drop_replication_slot('%s')) and restart to reload the tables",
			cfg.Slot, slot.ConfirmedFlush, progress, cfg.Slot))
	}
	var need []changebatch.Table
	for _, t := range s.tables {
		if _, ok := loaded[t.String()]; !ok {
			need = append(need, t)
		}
	}
	if len(need) == 0 {
		return progress, nil
	}
	exp, err := backfill.Export(ctx, cfg.Source)
	if err != nil {
		return 0, err
	}
	defer exp.Close(context.WithoutCancel(ctx))
	return progress, s.loadTables(ctx, need, exp.Snapshot)
}

func (s *session) recordProgress(ctx context.Context, lsn pglogrepl.LSN) error {
	tx, err := s.ap.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := tx.SetProgress(ctx, s.cfg.Slot, lsn); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// loadTables copies every row of tables visible in snap into the target through the apply step,
// at version (snap.LSN, 0), and records each completed load with its snapshot LSN.
func (s *session) loadTables(ctx context.Context, tables []changebatch.Table, snap backfill.Snapshot) error {
	for _, t := range tables {
		if err := s.loadTable(ctx, t, snap); err != nil {
			return err
		}
	}
	return nil
}

func (s *session) loadTable(ctx context.Context, t changebatch.Table, snap backfill.Snapshot) error {
	log := s.cfg.Logger.With("table", t.String(), "snapshot_lsn", snap.LSN.String())
	if err := apply.AbandonBackfills(ctx, s.tgt, t, s.cfg.Slot); err != nil {
		return err
	}
	id, err := apply.StartBackfill(ctx, s.tgt, t, snap.LSN, s.cfg.Slot)
	if err != nil {
		return err
	}
	log.Info("loading table")
	began := time.Now()
	n, total, err := s.copyTable(ctx, t, snap, log)
	if err != nil {
		if ferr := apply.FailBackfill(context.WithoutCancel(ctx), s.tgt, id, total.Applied+total.Suppressed); ferr == nil && ctx.Err() != nil {
			log.Warn("initial load interrupted: the table is loaded again from a new snapshot at the next start", "rows", total.Applied+total.Suppressed)
		}
		return fmt.Errorf("load %s: %w", t, err)
	}
	tx, err := s.ap.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	ghosts, err := tx.Fence(ctx, t, changebatch.Version{LSN: snap.LSN})
	if err != nil {
		return err
	}
	if err := apply.FinishBackfill(ctx, tx.Conn(), id, n); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	secs := time.Since(began).Seconds()
	log.Info("loaded table", "rows", n, "applied", total.Applied, "suppressed", total.Suppressed, "tombstoned_absent", ghosts,
		"seconds", fmt.Sprintf("%.1f", secs), "rows_per_s", int64(float64(n)/max(secs, 0.001)))
	return nil
}

// copyTable reads t at snap and applies its rows, one target transaction per batch. Reading and
// applying overlap: the reader runs at most two batches ahead of the apply step.
func (s *session) copyTable(ctx context.Context, t changebatch.Table, snap backfill.Snapshot, log *slog.Logger) (int64, apply.Result, error) {
	var total apply.Result
	var read int64
	batches := make(chan arrow.RecordBatch, 2)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(batches)
		var err error
		read, err = backfill.ReadTable(gctx, s.src, snap, t, s.cfg.LoadBatchRows, func(ctx context.Context, rec arrow.RecordBatch) error {
			rec.Retain()
			select {
			case batches <- rec:
				return nil
			case <-ctx.Done():
				rec.Release()
				return ctx.Err()
			}
		})
		return err
	})
	g.Go(func() error {
		var applied int64
		began, lastLog := time.Now(), time.Now()
		for rec := range batches {
			if time.Since(lastLog) >= 10*time.Second {
				lastLog = time.Now()
				log.Info("loading table", "rows", applied, "rows_per_s", int64(float64(applied)/time.Since(began).Seconds()))
			}
			res, err := s.applyBatch(gctx, rec)
			applied += rec.NumRows()
			rec.Release()
			if err != nil {
				return err
			}
			total.Add(res)
			if k := s.cfg.Knobs.AfterLoadBatch; k != nil {
				k(t.String(), applied)
			}
		}
		return nil
	})
	err := g.Wait()
	return read, total, err
}

// applyBatch applies one batch in its own target transaction.
func (s *session) applyBatch(ctx context.Context, rec arrow.RecordBatch) (apply.Result, error) {
	tx, err := s.ap.Begin(ctx)
	if err != nil {
		return apply.Result{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	res, err := tx.Apply(ctx, rec)
	if err != nil {
		return res, err
	}
	return res, tx.Commit(ctx)
}
