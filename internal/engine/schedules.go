package engine

import (
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/schedule"
)

// backfillSchedules returns a streaming session's backfill schedules (Config.BackfillSchedule
// over its streamed tables, Config.SnapshotSchedule over those kept by snapshots only) as a member
// of its errgroup: each backfill is st.backfillJob, counted by mon, and keeps what the stream
// covers from st.lsn.
func backfillSchedules(st sessionStart, mon Monitor) schedule.Backfills {
	cfg := st.cfg
	return schedule.Backfills{
		Schedule: cfg.BackfillSchedule, SnapshotSchedule: cfg.SnapshotSchedule,
		Tables: st.tables, SnapshotOnly: st.snapshotOnly, Slot: cfg.Slot, KeepFrom: st.lsn,
		NewJob: func(tables []changebatch.Table, trigger, what string) backfillrun.Job {
			return st.backfillJob(mon, tables, trigger, what)
		},
		SyncSequences: cfg.SyncSequences, Source: cfg.Source, Primary: cfg.Primary, Target: cfg.Target, Logger: cfg.Logger,
		OnEvent: cfg.Knobs.Schedule, AfterChunk: cfg.Knobs.AfterScheduledChunk,
	}
}

// verifySchedule returns a streaming session's verify schedule (Config.VerifySchedule over
// tables, counted by mon) as a member of its errgroup.
func verifySchedule(cfg Config, tables []changebatch.Table, mon Monitor) schedule.Verifies {
	return schedule.Verifies{
		Schedule: cfg.VerifySchedule, Source: cfg.Source, Primary: cfg.Primary, Target: cfg.Target, Tables: tables,
		Repair: cfg.VerifyRepair, Logger: cfg.Logger, Monitor: mon, Verified: cfg.Knobs.Verified,
		Pacer: cfg.pace.verifyPacer(),
	}
}
