package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/robfig/cron/v3"
)

// scheduleParser reads --backfill-schedule: the standard 5-field cron spec (minute hour
// day-of-month month day-of-week), an optional leading seconds field, and descriptors such as
// @daily, @hourly or @every 10m (github.com/robfig/cron/v3). Times are in the daemon's local time
// zone unless the spec starts with CRON_TZ=Zone.
var scheduleParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseSchedule checks a --backfill-schedule spec; "" means no schedule.
func parseSchedule(spec string) (cron.Schedule, error) {
	if spec == "" {
		return nil, nil
	}
	s, err := scheduleParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("--backfill-schedule %q: %w (use a cron spec such as \"0 3 * * *\", or @daily, @every 6h)", spec, err)
	}
	return s, nil
}

// scheduleEvent names what a scheduled backfill tick did, for logs and the test hook.
type scheduleEvent string

const (
	scheduleStarted   scheduleEvent = "started"
	scheduleSkipped   scheduleEvent = "skipped"
	scheduleCompleted scheduleEvent = "completed"
	scheduleFailed    scheduleEvent = "failed"
)

// startSchedule runs a backfill of every selected table at each tick of the session's schedule
// while the session streams; start is where the stream began, so chunks an interrupted scheduled
// run completed at or above it are kept. A tick while the previous scheduled backfill still runs
// is skipped, as is a table another process is backfilling; both are logged and counted. The
// returned function stops the schedule and waits for a running backfill to end (it is cancelled
// with the session).
func (s *session) startSchedule(ctx context.Context, start pglogrepl.LSN) func() {
	cfg := s.cfg
	if cfg.BackfillSchedule == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var running atomic.Bool
	var skipped atomic.Int64
	hook := func(ev scheduleEvent) {
		if k := cfg.Knobs.Schedule; k != nil {
			k(ev)
		}
	}
	c := cron.New(cron.WithParser(scheduleParser))
	c.Schedule(cfg.BackfillSchedule, cron.FuncJob(func() {
		if !running.CompareAndSwap(false, true) {
			n := skipped.Add(1)
			cfg.Logger.Warn("scheduled backfill skipped: the previous one is still running", "skipped_total", n)
			hook(scheduleSkipped)
			return
		}
		defer running.Store(false)
		hook(scheduleStarted)
		cfg.Logger.Info("scheduled backfill starting", "tables", len(s.tables), "next", cfg.BackfillSchedule.Next(time.Now()).Format(time.RFC3339))
		rep, err := runBackfill(ctx, backfillJob{
			Source: cfg.Source, Target: cfg.Target, Tables: s.tables, Trigger: apply.TriggerSchedule, Slot: cfg.Slot,
			Workers: cfg.BackfillWorkers, ChunkRows: cfg.ChunkRows, BatchRows: backfillBatchRows,
			Resume: true, KeepFrom: start, Busy: busySkip, SnapshotWarn: cfg.SnapshotWarn, Logger: cfg.Logger,
			Progress:   cfg.Metrics.progress(apply.TriggerSchedule, newProgress(nil, false, "scheduled backfill", cfg.Logger, 10*time.Second)),
			AfterChunk: cfg.Knobs.AfterScheduledChunk, Metrics: cfg.Metrics,
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
			hook(scheduleFailed)
			return
		}
		logSequenceSync(ctx, cfg, s.tables, rep)
		hook(scheduleCompleted)
	}))
	c.Start()
	cfg.Logger.Info("scheduled backfills on", "tables", len(s.tables), "next", cfg.BackfillSchedule.Next(time.Now()).Format(time.RFC3339))
	return func() {
		cancel()
		<-c.Stop().Done() // done when a running backfill returned
	}
}
