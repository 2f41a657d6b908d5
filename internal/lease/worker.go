package lease

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// The lease of backfill processes: the process that runs a backfill run and every process that
// joined it (Join) record, every CheckEvery, that their target sessions are alive
// (coverage.Heartbeat); every running backfill run and every streaming daemon ends the sessions of
// a process silent past Term (coverage.EndSilentWorkers, whichever run it belongs to), so a
// frozen or cut-off host neither holds its chunks, nor the row locks of its open transactions,
// nor shows its run as running for ever. The same lease as the leader's (a lease, as in Gray and
// Cheriton, "Leases", SOSP 1989).

// WatchWorkers ends, every timings' CheckEvery until stop, the target sessions of other
// backfill processes (of any run) silent past Term, logging each at WARN, and a session the
// role may not end once at ERROR with the fix. Every backfill run and every streaming daemon
// session watches, so a frozen process is ended even when its run has died. A check that comes
// late (this process was paused or starved itself, as a whole frozen host is) ends nothing: the
// other processes of a host that froze with it get a heartbeat in first. It uses a connection of
// its own to target; a failed check is logged and tried again.
// Unset timings are Default's (Timings.OrDefault).
func WatchWorkers(ctx context.Context, target string, timings Timings, log *slog.Logger) (stop func(), err error) {
	tm := timings.OrDefault()
	conn, err := pgsession.Connect(ctx, target, "target")
	if err != nil {
		return nil, err
	}
	last := time.Now()
	refused := map[int32]bool{}
	stopTicking := Every(ctx, tm.CheckEvery, func(ctx context.Context) {
		late := time.Since(last) > 2*tm.CheckEvery+tm.CheckTimeout
		last = time.Now()
		if late {
			log.Info("skipped a check of the backfill processes' lease: this process's own checks were late (was it paused?)")
			return
		}
		cctx, cancel := context.WithTimeout(ctx, tm.CheckTimeout)
		defer cancel()
		ended, err := coverage.EndSilentWorkers(cctx, conn, tm.Term, Holder())
		if err != nil && ctx.Err() == nil {
			log.Warn("could not check the lease of backfill processes; trying again", "err", err)
		}
		for _, w := range ended {
			attrs := []any{"backfill_run", w.RunID, "host", w.Host, "target_pid", w.PID, "silent_seconds", int(w.Silent), "lease", tm.Term.String()}
			switch {
			case w.Refused != nil && !refused[w.PID]:
				refused[w.PID] = true
				log.Error("could not end the target session of a backfill process silent past the lease: it keeps its chunks and row locks until it ends; let the target role end it (the same role for every pgconverge process, or GRANT pg_signal_backend; a superuser's session only a superuser may end)",
					append(attrs, "err", w.Refused)...)
			case w.Refused != nil:
			case w.Joined:
				log.Warn("ended the target session of a joined backfill worker silent past the lease (a frozen host, or a network that broke without resetting the connection): its chunks are claimable again and its row locks released", attrs...)
			default:
				log.Warn("ended a target session of a backfill run's process silent past the lease (a frozen process or host, or a network that broke without resetting the connection): the run no longer runs (the next run of its tables resumes it), its row locks are released", attrs...)
			}
		}
	})
	return func() { stopTicking(); conn.Close(context.WithoutCancel(ctx)) }, nil
}

// Worker is the lease of one backfill process's target sessions in run runID: Add registers
// a session (coverage.RegisterWorker), and every timings' CheckEvery until End a connection of its own
// records them all alive, reconnecting after a failure (each failure logged at WARN). When no
// record succeeded for the term, other processes may already have ended the sessions: it calls
// lost with the error, once, for the process to stop.
type Worker struct {
	runID  int64
	joined bool
	mu     sync.Mutex
	pids   []int32
	stop   func()
}

// StartWorker starts the lease of this process's sessions in run runID on target; joined
// tells whether the process joined the run rather than runs it. Unset timings are Default's
// (Timings.OrDefault).
func StartWorker(ctx context.Context, target string, runID int64, joined bool, timings Timings, log *slog.Logger, lost func(error)) (*Worker, error) {
	tm := timings.OrDefault()
	conn, err := pgsession.Connect(ctx, target, "target")
	if err != nil {
		return nil, err
	}
	l := &Worker{runID: runID, joined: joined}
	seen := time.Now()
	var once sync.Once
	failed := func(ctx context.Context, err error) {
		if ctx.Err() != nil {
			return
		}
		log.Warn("could not record this process's backfill sessions alive on the target; trying again (other pgconverge processes end them after the lease without)",
			"silent_seconds", int(time.Since(seen).Seconds()), "lease", tm.Term.String(), "err", err)
		if time.Since(seen) > tm.Term {
			once.Do(func() {
				lost(fmt.Errorf("this process could not show the other pgconverge processes that its backfill sessions are alive for %s, the lease they end silent sessions after: %w", tm.Term, err))
			})
		}
	}
	stopTicking := Every(ctx, tm.CheckEvery, func(ctx context.Context) {
		cctx, cancel := context.WithTimeout(ctx, tm.CheckTimeout)
		defer cancel()
		if conn.IsClosed() {
			c, err := pgsession.Connect(cctx, target, "target")
			if err != nil {
				failed(ctx, err)
				return
			}
			conn = c
		}
		if err := coverage.Heartbeat(cctx, conn, Holder(), l.registered()); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			failed(ctx, err)
			return
		}
		seen = time.Now()
	})
	l.stop = func() { stopTicking(); conn.Close(context.WithoutCancel(ctx)) }
	return l, nil
}

// Add registers conn's session under the lease.
func (l *Worker) Add(ctx context.Context, conn *pgx.Conn) error {
	if err := coverage.RegisterWorker(ctx, conn, l.runID, Holder(), l.joined); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pids = append(l.pids, int32(conn.PgConn().PID()))
	return nil
}

// registered returns the backend pids of the sessions registered so far.
func (l *Worker) registered() []int32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.pids)
}

// End stops the heartbeat and removes the process's sessions from the ledger over conn; a failure
// other than conn's session having been ended is logged on log (the rows of ended sessions are
// removed later by any process's end).
func (l *Worker) End(ctx context.Context, conn *pgx.Conn, log *slog.Logger) {
	l.stop()
	if conn.IsClosed() {
		return
	}
	err := coverage.ForgetWorkers(context.WithoutCancel(ctx), conn, l.registered())
	if err != nil && !pgsession.IsCode(err, pgerrcode.AdminShutdown) && !conn.IsClosed() {
		log.Warn("could not remove this process's backfill sessions from the ledger", "err", err)
	}
}
