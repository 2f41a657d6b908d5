package engine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// The lease of joined backfill workers: a process that joined a run (Join) records, every
// leaderCheckEvery, that its workers' target sessions are alive (coverage.Heartbeat); every running
// backfill run and every streaming daemon ends the sessions of a joined process silent past
// leaderLease (coverage.EndSilentWorkers, whichever run it joined),
// so a frozen or cut-off host neither holds its chunks nor the row locks of its open transactions
// for ever. The same lease as the leader's (a lease, as in Gray and Cheriton, "Leases", SOSP 1989).

// watchJoinedWorkers ends, every leaderCheckEvery until stop, the target sessions of joined
// backfill workers (of any run) whose process went silent past leaderLease, logging each at WARN.
// Every backfill run and every streaming daemon session watches, so a frozen joiner is ended even
// when the run it joined has died. It uses a connection of its own to target; a failed check is
// logged and tried again.
func watchJoinedWorkers(ctx context.Context, target string, log *slog.Logger) (stop func(), err error) {
	conn, err := pgsession.Connect(ctx, target, "target")
	if err != nil {
		return nil, err
	}
	stopTicking := ticking(ctx, leaderCheckEvery, func(ctx context.Context) {
		cctx, cancel := context.WithTimeout(ctx, leaderCheckTimeout)
		defer cancel()
		ended, err := coverage.EndSilentWorkers(cctx, conn, leaderLease)
		if err != nil && ctx.Err() == nil {
			log.Warn("could not check the joined workers' lease; trying again", "err", err)
		}
		for _, w := range ended {
			log.Warn("ended the target session of a joined backfill worker silent past the lease (a frozen host, or a network that broke without resetting the connection): its chunks are claimable again and its row locks released",
				"worker", w.Host, "target_pid", w.PID, "silent_seconds", int(w.Silent), "lease", leaderLease.String())
		}
	})
	return func() { stopTicking(); conn.Close(context.WithoutCancel(ctx)) }, nil
}

// heartbeat records the joined workers' sessions pids() alive every leaderCheckEvery until stop,
// over a connection of its own to target; when a heartbeat fails (or takes over
// leaderCheckTimeout) it calls lost with the error, once, for the process to stop: the run will end
// its sessions after the lease.
func heartbeat(ctx context.Context, target string, pids func() []int32, lost func(error)) (stop func(), err error) {
	conn, err := pgsession.Connect(ctx, target, "target")
	if err != nil {
		return nil, err
	}
	var once sync.Once
	stopTicking := ticking(ctx, leaderCheckEvery, func(ctx context.Context) {
		cctx, cancel := context.WithTimeout(ctx, leaderCheckTimeout)
		defer cancel()
		if err := coverage.Heartbeat(cctx, conn, pids()); err != nil && ctx.Err() == nil {
			once.Do(func() { lost(fmt.Errorf("this process could not show the run its workers are alive: %w", err)) })
		}
	})
	return func() { stopTicking(); conn.Close(context.WithoutCancel(ctx)) }, nil
}
