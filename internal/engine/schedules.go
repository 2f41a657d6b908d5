package engine

import (
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/schedule"
)

// backfillSchedules returns a streaming session's backfill schedules (Config.BackfillSchedule
// over tables, Config.SnapshotSchedule over snapshotOnly) as a member of its errgroup: the stream
// started at start, and newJob builds each backfill (session.backfillJob).
func backfillSchedules(cfg Config, tables, snapshotOnly []changebatch.Table, start pglogrepl.LSN,
	newJob func(tables []changebatch.Table, trigger, what string) backfillrun.Job) schedule.Backfills {
	return schedule.Backfills{
		Schedule: cfg.BackfillSchedule, SnapshotSchedule: cfg.SnapshotSchedule,
		Tables: tables, SnapshotOnly: snapshotOnly, Slot: cfg.Slot, KeepFrom: start, NewJob: newJob,
		SyncSequences: cfg.SyncSequences, Source: cfg.Source, Target: cfg.Target, Logger: cfg.Logger,
		OnEvent: cfg.Knobs.Schedule, AfterChunk: cfg.Knobs.AfterScheduledChunk,
	}
}

// verifySchedule returns a streaming session's verify schedule (Config.VerifySchedule over
// tables, counted by mon) as a member of its errgroup.
func verifySchedule(cfg Config, tables []changebatch.Table, mon Monitor) schedule.Verifies {
	return schedule.Verifies{
		Schedule: cfg.VerifySchedule, Source: cfg.Source, Target: cfg.Target, Tables: tables,
		Repair: cfg.VerifyRepair, Logger: cfg.Logger, Monitor: mon, Verified: cfg.Knobs.Verified,
	}
}
