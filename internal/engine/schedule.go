package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/coverage"
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

// startSchedule runs a backfill of every selected table at each tick of the session's schedule
// while the session streams; start is where the stream began, so chunks an interrupted scheduled
// run completed at or above it are kept. A tick while the previous scheduled backfill still runs
// is skipped, as is a table another process is backfilling; both are logged and counted. When ctx
// ends it stops the schedule, waits for a running backfill to end (it is cancelled with ctx) and
// returns nil: a failed scheduled backfill is logged and resumed at the next tick, it never ends
// the session.
func (s *session) runSchedule(ctx context.Context, start pglogrepl.LSN) error {
	cfg := s.cfg
	if cfg.BackfillSchedule == nil {
		return nil
	}
	var running atomic.Bool
	var skipped atomic.Int64
	hook := func(ev ScheduleEvent) {
		if k := cfg.Knobs.Schedule; k != nil {
			k(ev)
		}
	}
	c := cron.New()
	c.Schedule(cfg.BackfillSchedule, cron.FuncJob(func() {
		if !running.CompareAndSwap(false, true) {
			n := skipped.Add(1)
			cfg.Logger.Warn("scheduled backfill skipped: the previous one is still running", "skipped_total", n)
			hook(ScheduleSkipped)
			return
		}
		defer running.Store(false)
		hook(ScheduleStarted)
		cfg.Logger.Info("scheduled backfill starting", "tables", len(s.tables), "next", cfg.BackfillSchedule.Next(time.Now()).Format(time.RFC3339))
		rep, err := runBackfill(ctx, backfillJob{
			Source: cfg.Source, Target: cfg.Target, Tables: s.tables, Trigger: coverage.TriggerSchedule, Slot: cfg.Slot,
			Workers: cfg.BackfillWorkers, ChunkRows: cfg.ChunkRows, BatchRows: backfillBatchRows,
			Resume: true, KeepFrom: start, Busy: busySkip, SnapshotWarn: cfg.SnapshotWarn, Logger: cfg.Logger,
			Progress:   s.mon.BackfillProgress(coverage.TriggerSchedule, NewLogProgress(cfg.Logger, "scheduled backfill", 10*time.Second)),
			AfterChunk: cfg.Knobs.AfterScheduledChunk, Monitor: s.mon,
		})
		for _, t := range rep.Skipped {
			n := skipped.Add(1)
			cfg.Logger.Warn("scheduled backfill skipped a table: another backfill of it is running", "table", t, "skipped_total", n)
		}
		if err != nil {
			if ctx.Err() == nil {
				cfg.Logger.Error("scheduled backfill failed: the next tick resumes it", "run", rep.RunID, "err", err)
			} else {
				cfg.Logger.Warn("scheduled backfill interrupted by the session's end: the next tick resumes it", "run", rep.RunID)
			}
			hook(ScheduleFailed)
			return
		}
		logSequenceSync(ctx, cfg, s.tables, rep)
		hook(ScheduleCompleted)
	}))
	c.Start()
	cfg.Logger.Info("scheduled backfills on", "tables", len(s.tables), "next", cfg.BackfillSchedule.Next(time.Now()).Format(time.RFC3339))
	<-ctx.Done()
	<-c.Stop().Done() // done when a running backfill returned
	return nil
}
