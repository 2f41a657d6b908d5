package schedule

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/sequences"
	"github.com/robfig/cron/v3"
)

// Event names what a scheduled backfill tick did, for logs and the Backfills.OnEvent hook.
type Event string

// What a scheduled backfill tick did.
const (
	Started   Event = "started"
	Skipped   Event = "skipped"
	Completed Event = "completed"
	Failed    Event = "failed"
)

// Backfills runs a streaming session's backfill schedules: Schedule (--backfill-schedule) over
// the streamed Tables, resuming an interrupted scheduled run, and SnapshotSchedule
// (--snapshot-schedule) over the SnapshotOnly tables, each read whole at each tick. A nil
// schedule, or one without tables, does nothing. Its fields are values given when the session
// starts streaming; Run reads them and changes none.
type Backfills struct {
	// Schedule and SnapshotSchedule are the ticks (Parse); nil means none.
	Schedule, SnapshotSchedule cron.Schedule
	// Tables are the session's streamed tables, SnapshotOnly those it keeps by snapshots only
	// (changebatch.Table.SnapshotOnly).
	Tables, SnapshotOnly []changebatch.Table
	// Slot is the session's slot, which the scheduled backfills of Tables follow; KeepFrom is
	// the LSN the session's stream started at: chunks an interrupted scheduled run completed at
	// a snapshot LSN at or above it are kept.
	Slot     string
	KeepFrom pglogrepl.LSN
	// NewJob returns a backfill of tables by the daemon's configuration with trigger (always
	// coverage.TriggerSchedule here), its progress and logs named what; Run sets the slot,
	// resuming, BusySkip and the chunk hook.
	NewJob func(tables []changebatch.Table, trigger, what string) backfillrun.Job
	// With SyncSequences, the sequences of the tables a scheduled backfill completed are synced
	// from Source to Target (URLs) after it (sequences.SyncAfterBackfill).
	SyncSequences  bool
	Source, Target string
	// Primary is the URL of Source's primary when Source is a hot standby (pgconverge run
	// --primary): sequence values are read there.
	Primary string
	Logger  *slog.Logger
	// OnEvent, a test hook, runs at each Event of a tick; AfterChunk, a test hook, after each
	// committed chunk of a scheduled backfill (backfillrun.Job.AfterChunk). Nil hooks do nothing.
	OnEvent    func(Event)
	AfterChunk func(table string, rows int64)
}

// Run runs both schedules until ctx ends, then stops them, waits for a running backfill
// (cancelled with ctx) and returns nil: a failed scheduled backfill is logged and run again at
// the next tick, it never ends the session.
func (b Backfills) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.run(ctx, b.SnapshotSchedule, job{tables: b.SnapshotOnly, what: "snapshot refresh"})
	}()
	b.run(ctx, b.Schedule, job{tables: b.Tables, slot: b.Slot, keepFrom: b.KeepFrom, resume: true, what: "scheduled backfill"})
	<-done
	return nil
}

// job is what a backfill schedule backfills: tables, followed by slot ("" for tables kept by
// snapshots only, which are read whole at each tick: resume false), keeping chunks of an
// interrupted run completed at or above keepFrom when resume is set; what names it in logs.
type job struct {
	tables   []changebatch.Table
	slot     string
	keepFrom pglogrepl.LSN
	resume   bool
	what     string
}

// event runs the OnEvent hook, when set, with ev.
func (b Backfills) event(ev Event) {
	if b.OnEvent != nil {
		b.OnEvent(ev)
	}
}

// run runs a backfill of j's tables at each tick of sched (nothing when sched is nil or there is
// no table) until ctx ends. A tick while the previous backfill still runs is skipped, as is a
// table another process is backfilling; both are logged and counted. When ctx ends it stops the
// schedule and waits for a running backfill to end (it is cancelled with ctx).
func (b Backfills) run(ctx context.Context, sched cron.Schedule, j job) {
	if sched == nil || len(j.tables) == 0 {
		return
	}
	var running atomic.Bool
	var skipped atomic.Int64
	c := cron.New()
	c.Schedule(sched, cron.FuncJob(func() {
		if !running.CompareAndSwap(false, true) {
			n := skipped.Add(1)
			b.Logger.Warn(j.what+" skipped: the previous one is still running", "skipped_total", n)
			b.event(Skipped)
			return
		}
		defer running.Store(false)
		b.event(Started)
		b.Logger.Info(j.what+" starting", "tables", len(j.tables), "next", sched.Next(time.Now()).Format(time.RFC3339))
		bj := b.NewJob(j.tables, coverage.TriggerSchedule, j.what)
		bj.Slot, bj.Resume, bj.KeepFrom, bj.Busy, bj.AfterChunk = j.slot, j.resume, j.keepFrom, backfillrun.BusySkip, b.AfterChunk
		rep, err := backfillrun.Run(ctx, bj)
		for _, t := range rep.Skipped {
			n := skipped.Add(1)
			b.Logger.Warn(j.what+" skipped a table: another backfill of it is running", "table", t, "skipped_total", n)
		}
		if err != nil {
			if ctx.Err() == nil {
				b.Logger.Error(j.what+" failed: the next tick runs it again", "run", rep.RunID, "err", err)
			} else {
				b.Logger.Warn(j.what+" interrupted by the session's end: the next tick runs it again", "run", rep.RunID)
			}
			b.event(Failed)
			return
		}
		if b.SyncSequences {
			sequences.SyncAfterBackfill(ctx, b.Source, b.Primary, b.Target, rep.Completed(j.tables), rep.RunID, b.Logger)
		}
		b.event(Completed)
	}))
	c.Start()
	b.Logger.Info("backfill schedule on", "what", j.what, "tables", len(j.tables), "next", sched.Next(time.Now()).Format(time.RFC3339))
	<-ctx.Done()
	<-c.Stop().Done() // done when a running backfill returned
}
