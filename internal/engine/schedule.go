package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/robfig/cron/v3"
)

// ParseSchedule reads a schedule spec (--backfill-schedule, --verify-schedule): the standard 5-field cron spec (minute hour
// day-of-month month day-of-week), an optional leading seconds field, and descriptors such as
// @daily, @hourly or @every 10m (github.com/robfig/cron/v3). Times are in the daemon's local time
// zone unless the spec starts with CRON_TZ=Zone. "" means no schedule (nil); the error names the
// spec and the accepted forms.
func ParseSchedule(spec string) (cron.Schedule, error) {
	if spec == "" {
		return nil, nil
	}
	p := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	s, err := p.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w (use a cron spec such as \"0 3 * * *\", or @daily, @every 6h)", spec, err)
	}
	return s, nil
}

// ScheduleEvent names what a scheduled backfill tick did, for logs and the Knobs.Schedule hook.
type ScheduleEvent string

// What a scheduled backfill tick did.
const (
	ScheduleStarted   ScheduleEvent = "started"
	ScheduleSkipped   ScheduleEvent = "skipped"
	ScheduleCompleted ScheduleEvent = "completed"
	ScheduleFailed    ScheduleEvent = "failed"
)

// runSchedule runs the session's backfill schedules while it streams: --backfill-schedule over
// the streamed tables and --snapshot-schedule over the tables kept by snapshots only
// (backfillSchedule each). It returns nil when ctx ends.
func (s *session) runSchedule(ctx context.Context, start pglogrepl.LSN) error {
	cfg := s.cfg
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.backfillSchedule(ctx, cfg.SnapshotSchedule, scheduledJob{tables: s.snapshotOnly, what: "snapshot refresh"})
	}()
	s.backfillSchedule(ctx, cfg.BackfillSchedule, scheduledJob{tables: s.tables, slot: cfg.Slot, keepFrom: start, resume: true, what: "scheduled backfill"})
	<-done
	return nil
}

// scheduledJob is what a backfill schedule backfills: tables, followed by slot ("" for tables
// kept by snapshots only, which are read whole at each tick: resume false), keeping chunks of an
// interrupted run completed at or above keepFrom when resume is set; what names it in logs.
type scheduledJob struct {
	tables   []changebatch.Table
	slot     string
	keepFrom pglogrepl.LSN
	resume   bool
	what     string
}

// backfillSchedule runs a backfill of job's tables at each tick of sched (nothing when sched is
// nil or there is no table) while the session streams. A tick while the previous backfill still
// runs is skipped, as is a table another process is backfilling; both are logged and counted.
// When ctx ends it stops the schedule and waits for a running backfill to end (it is cancelled
// with ctx): a failed scheduled backfill is logged and resumed at the next tick, it never ends
// the session.
func (s *session) backfillSchedule(ctx context.Context, sched cron.Schedule, job scheduledJob) {
	cfg := s.cfg
	if sched == nil || len(job.tables) == 0 {
		return
	}
	var running atomic.Bool
	var skipped atomic.Int64
	hook := func(ev ScheduleEvent) {
		if k := cfg.Knobs.Schedule; k != nil {
			k(ev)
		}
	}
	c := cron.New()
	c.Schedule(sched, cron.FuncJob(func() {
		if !running.CompareAndSwap(false, true) {
			n := skipped.Add(1)
			cfg.Logger.Warn(job.what+" skipped: the previous one is still running", "skipped_total", n)
			hook(ScheduleSkipped)
			return
		}
		defer running.Store(false)
		hook(ScheduleStarted)
		cfg.Logger.Info(job.what+" starting", "tables", len(job.tables), "next", sched.Next(time.Now()).Format(time.RFC3339))
		bj := s.backfillJob(job.tables, coverage.TriggerSchedule, job.what)
		bj.Slot, bj.Resume, bj.KeepFrom, bj.Busy, bj.AfterChunk = job.slot, job.resume, job.keepFrom, backfillrun.BusySkip, cfg.Knobs.AfterScheduledChunk
		rep, err := backfillrun.Run(ctx, bj)
		for _, t := range rep.Skipped {
			n := skipped.Add(1)
			cfg.Logger.Warn(job.what+" skipped a table: another backfill of it is running", "table", t, "skipped_total", n)
		}
		if err != nil {
			if ctx.Err() == nil {
				cfg.Logger.Error(job.what+" failed: the next tick runs it again", "run", rep.RunID, "err", err)
			} else {
				cfg.Logger.Warn(job.what+" interrupted by the session's end: the next tick runs it again", "run", rep.RunID)
			}
			hook(ScheduleFailed)
			return
		}
		logSequenceSync(ctx, cfg, job.tables, rep)
		hook(ScheduleCompleted)
	}))
	c.Start()
	cfg.Logger.Info("backfill schedule on", "what", job.what, "tables", len(job.tables), "next", sched.Next(time.Now()).Format(time.RFC3339))
	<-ctx.Done()
	<-c.Stop().Done() // done when a running backfill returned
}
