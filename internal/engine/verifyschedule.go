package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/verify"
	"github.com/robfig/cron/v3"
)

// runVerifySchedule verifies the session's tables at each tick of Config.VerifySchedule while the
// session streams, with the code of `pgconverge verify` (Verify, trigger "schedule"), repairing
// with VerifyRepair. A tick while the previous verify runs is skipped. Open discrepancies are
// logged at ERROR with the fix; a failed verify is logged and tried again at the next tick, never
// ending the session. When ctx ends it stops the schedule, waits for a running verify (cancelled
// with ctx) and returns nil.
func (s *session) runVerifySchedule(ctx context.Context) error {
	cfg := s.cfg
	if cfg.VerifySchedule == nil {
		return nil
	}
	var running atomic.Bool
	tables := make([]string, len(s.tables))
	for i, t := range s.tables {
		tables[i] = t.Quoted()
	}
	c := cron.New()
	c.Schedule(cfg.VerifySchedule, cron.FuncJob(func() {
		if !running.CompareAndSwap(false, true) {
			cfg.Logger.Warn("scheduled verify skipped: the previous one is still running")
			return
		}
		defer running.Store(false)
		rep, err := verify.Run(ctx, verify.Config{
			Source: cfg.Source, Target: cfg.Target, Tables: tables, Repair: cfg.VerifyRepair, Trigger: coverage.VerifySchedule,
			Wait: time.Minute, Logger: cfg.Logger, Monitor: s.mon,
		})
		switch {
		case ctx.Err() != nil:
			cfg.Logger.Warn("scheduled verify interrupted by the session's end")
		case err != nil && !errors.Is(err, verify.ErrNotVerified):
			cfg.Logger.Error("scheduled verify failed: the next tick tries again", "run", rep.RunID, "err", err)
		case rep.Open > 0:
			cfg.Logger.Error("scheduled verify: discrepancies are open; see pgconverge.discrepancies on the target and run `pgconverge verify --repair` (or run with --verify-repair)",
				"run", rep.RunID, "snapshot_lsn", rep.Snapshot, "found", rep.Found, "repaired", rep.Repaired, "open", rep.Open, "err", err)
		default:
			cfg.Logger.Info("scheduled verify: no discrepancy open", "run", rep.RunID, "snapshot_lsn", rep.Snapshot,
				"found", rep.Found, "repaired", rep.Repaired, "err", err)
		}
		if k := cfg.Knobs.Verified; k != nil {
			k(rep, err)
		}
	}))
	c.Start()
	cfg.Logger.Info("scheduled verify on", "tables", len(s.tables), "repair", cfg.VerifyRepair, "next", cfg.VerifySchedule.Next(time.Now()).Format(time.RFC3339))
	<-ctx.Done()
	<-c.Stop().Done()
	return nil
}
