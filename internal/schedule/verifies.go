package schedule

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/pgconverge/pgconverge/internal/pacing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/verify"
	"github.com/robfig/cron/v3"
)

// verifyWait bounds how long a scheduled verify waits for the stream to have applied up to its
// snapshot (verify.Config.Wait).
const verifyWait = time.Minute

// Verifies runs a streaming session's verify schedule (--verify-schedule): at each tick of
// Schedule it verifies Tables with the code of `pgconverge verify` (verify.Run, trigger
// coverage.VerifySchedule), repairing what it finds with Repair. Its fields are values given when
// the session starts streaming; Run reads them and changes none.
type Verifies struct {
	// Schedule is the ticks (Parse); nil means no scheduled verify.
	Schedule cron.Schedule
	// Source and Target are the daemon's URLs; Tables the session's streamed tables.
	Source, Target string
	// Primary is the URL of Source's primary when Source is a hot standby (pgconverge run --primary).
	Primary string
	Tables  []changebatch.Table
	Repair  bool
	Logger  *slog.Logger
	// Monitor counts the runs' discrepancies (verify.Config.Monitor).
	Monitor verify.Monitor
	// Verified, a test hook, runs after each scheduled verify with its report and error; nil does
	// nothing.
	Verified func(verify.Report, error)
	// Pacer paces the runs' reads (verify.Config.Pacer).
	Pacer *pacing.Pacer
}

// Run verifies at each tick of Schedule until ctx ends (returning nil at once when Schedule is
// nil). A tick while the previous verify runs is skipped. Open discrepancies are logged at ERROR
// with the fix; a failed verify is logged and tried again at the next tick, never ending the
// session. When ctx ends it stops the schedule, waits for a running verify (cancelled with ctx)
// and returns nil.
func (v Verifies) Run(ctx context.Context) error {
	if v.Schedule == nil {
		return nil
	}
	var running atomic.Bool
	tables := make([]string, len(v.Tables))
	for i, t := range v.Tables {
		tables[i] = t.Quoted()
	}
	log := v.Logger
	c := cron.New()
	c.Schedule(v.Schedule, cron.FuncJob(func() {
		if !running.CompareAndSwap(false, true) {
			log.Warn("scheduled verify skipped: the previous one is still running")
			return
		}
		defer running.Store(false)
		rep, err := verify.Run(ctx, verify.Config{
			Source: v.Source, Primary: v.Primary, Target: v.Target, Tables: tables, Repair: v.Repair, Trigger: coverage.VerifySchedule,
			Wait: verifyWait, Logger: log, Monitor: v.Monitor, Pacer: v.Pacer,
		})
		switch {
		case ctx.Err() != nil:
			log.Warn("scheduled verify interrupted by the session's end")
		case err != nil && !errors.Is(err, verify.ErrNotVerified):
			log.Error("scheduled verify failed: the next tick tries again", "run", rep.RunID, "err", err)
		case rep.Open > 0:
			log.Error("scheduled verify: discrepancies are open; see pgconverge.discrepancies on the target and run `pgconverge verify --repair` (or run with --verify-repair)",
				"run", rep.RunID, "snapshot_lsn", rep.Snapshot, "found", rep.Found, "repaired", rep.Repaired, "open", rep.Open, "err", err)
		default:
			log.Info("scheduled verify: no discrepancy open", "run", rep.RunID, "snapshot_lsn", rep.Snapshot,
				"found", rep.Found, "repaired", rep.Repaired, "err", err)
		}
		if v.Verified != nil {
			v.Verified(rep, err)
		}
	}))
	c.Start()
	log.Info("scheduled verify on", "tables", len(v.Tables), "repair", v.Repair, "next", v.Schedule.Next(time.Now()).Format(time.RFC3339))
	<-ctx.Done()
	<-c.Stop().Done()
	return nil
}
