package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// prepareSlot makes sure the slot exists and every table is loaded, and returns the LSN to start
// streaming from. A new slot's own exported snapshot loads every table; with an existing slot,
// tables that have no completed load followed by this slot load from a fresh snapshot of a
// temporary slot (keeping what an interrupted load completed), while the main slot keeps their
// later changes.
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
		return created.ConsistentPoint, s.loadTables(ctx, s.tables, &snap, created.ConsistentPoint)
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
	return progress, s.loadTables(ctx, need, nil, progress)
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

// loadTables backfills tables before streaming starts (a backfill run with trigger "initial"):
// from snap when it is set (a new slot's own exported snapshot, which stays importable while the
// replication connection is idle), else from a temporary slot's. Chunks an interrupted load
// completed at an S at or above keepFrom, where the stream resumes, are kept.
func (s *session) loadTables(ctx context.Context, tables []changebatch.Table, snap *backfill.Snapshot, keepFrom pglogrepl.LSN) error {
	cfg := s.cfg
	_, err := runBackfill(ctx, backfillJob{
		Source: cfg.Source, Target: cfg.Target, Tables: tables, Trigger: apply.TriggerInitial, Slot: cfg.Slot,
		Workers: cfg.BackfillWorkers, ChunkRows: cfg.ChunkRows, BatchRows: backfillBatchRows, Snapshot: snap,
		Resume: true, KeepFrom: keepFrom, Busy: busyWait, SnapshotWarn: cfg.SnapshotWarn, Logger: cfg.Logger,
		Progress:   newProgress(nil, false, "initial load", cfg.Logger, 10*time.Second),
		AfterChunk: cfg.Knobs.AfterLoadChunk,
	})
	return err
}
