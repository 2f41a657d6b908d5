package engine

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// The lease of backfill processes: the process that runs a backfill run and every process that
// joined it (Join) record, every leaderCheckEvery, that their target sessions are alive
// (coverage.Heartbeat); every running backfill run and every streaming daemon ends the sessions of
// a process silent past leaderLease (coverage.EndSilentWorkers, whichever run it belongs to), so a
// frozen or cut-off host neither holds its chunks, nor the row locks of its open transactions,
// nor shows its run as running for ever. The same lease as the leader's (a lease, as in Gray and
// Cheriton, "Leases", SOSP 1989).

// watchWorkerLeases ends, every leaderCheckEvery until stop, the target sessions of backfill
// processes (of any run) silent past leaderLease, logging each at WARN. Every backfill run and
// every streaming daemon session watches, so a frozen process is ended even when its run has
// died. It uses a connection of its own to target; a failed check is logged and tried again.
func watchWorkerLeases(ctx context.Context, target string, log *slog.Logger) (stop func(), err error) {
	conn, err := pgsession.Connect(ctx, target, "target")
	if err != nil {
		return nil, err
	}
	stopTicking := ticking(ctx, leaderCheckEvery, func(ctx context.Context) {
		cctx, cancel := context.WithTimeout(ctx, leaderCheckTimeout)
		defer cancel()
		ended, err := coverage.EndSilentWorkers(cctx, conn, leaderLease)
		if err != nil && ctx.Err() == nil {
			log.Warn("could not check the lease of backfill processes; trying again", "err", err)
		}
		for _, w := range ended {
			what := "ended a target session of a backfill run's process silent past the lease (a frozen process or host, or a network that broke without resetting the connection): the run no longer runs (the next run of its tables resumes it), its row locks are released"
			if w.Joined {
				what = "ended the target session of a joined backfill worker silent past the lease (a frozen host, or a network that broke without resetting the connection): its chunks are claimable again and its row locks released"
			}
			log.Warn(what, "backfill_run", w.RunID, "host", w.Host, "target_pid", w.PID, "silent_seconds", int(w.Silent), "lease", leaderLease.String())
		}
	})
	return func() { stopTicking(); conn.Close(context.WithoutCancel(ctx)) }, nil
}

// workerLease is the lease of one backfill process's target sessions in run runID: add registers
// a session (coverage.RegisterWorker), and every leaderCheckEvery until end a connection of its own
// records them all alive, reconnecting after a failure. When no record succeeded for leaderLease,
// other processes may already have ended the sessions: it calls lost with the error, once, for the
// process to stop.
type workerLease struct {
	runID  int64
	joined bool
	mu     sync.Mutex
	pids   []int32
	stop   func()
}

// startWorkerLease starts the lease of this process's sessions in run runID on target; joined
// tells whether the process joined the run rather than runs it.
func startWorkerLease(ctx context.Context, target string, runID int64, joined bool, lost func(error)) (*workerLease, error) {
	conn, err := pgsession.Connect(ctx, target, "target")
	if err != nil {
		return nil, err
	}
	l := &workerLease{runID: runID, joined: joined}
	seen := time.Now()
	var once sync.Once
	stopTicking := ticking(ctx, leaderCheckEvery, func(ctx context.Context) {
		cctx, cancel := context.WithTimeout(ctx, leaderCheckTimeout)
		defer cancel()
		if conn.IsClosed() {
			c, err := pgsession.Connect(cctx, target, "target")
			if err != nil {
				l.failed(ctx, err, seen, &once, lost)
				return
			}
			conn = c
		}
		if err := coverage.Heartbeat(cctx, conn, l.registered()); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			l.failed(ctx, err, seen, &once, lost)
			return
		}
		seen = time.Now()
	})
	l.stop = func() { stopTicking(); conn.Close(context.WithoutCancel(ctx)) }
	return l, nil
}

// failed calls lost, once, with err when no heartbeat succeeded since seen for leaderLease.
func (l *workerLease) failed(ctx context.Context, err error, seen time.Time, once *sync.Once, lost func(error)) {
	if ctx.Err() == nil && time.Since(seen) > leaderLease {
		once.Do(func() {
			lost(fmt.Errorf("this process could not show the other pgconverge processes that its backfill sessions are alive for %s, the lease they end silent sessions after: %w", leaderLease, err))
		})
	}
}

// add registers conn's session under the lease.
func (l *workerLease) add(ctx context.Context, conn *pgx.Conn) error {
	if err := coverage.RegisterWorker(ctx, conn, l.runID, holder(), l.joined); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pids = append(l.pids, int32(conn.PgConn().PID()))
	return nil
}

// registered returns the backend pids of the sessions registered so far.
func (l *workerLease) registered() []int32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.pids)
}

// end stops the heartbeat and removes the process's sessions from the ledger over conn; a failure
// is logged on log (the rows are removed with any ended session's later).
func (l *workerLease) end(ctx context.Context, conn *pgx.Conn, log *slog.Logger) {
	l.stop()
	if conn.IsClosed() {
		return
	}
	if err := coverage.ForgetWorkers(context.WithoutCancel(ctx), conn, l.registered()); err != nil {
		log.Warn("could not remove this process's backfill sessions from the ledger", "err", err)
	}
}
