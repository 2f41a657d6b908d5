package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/internal/overlap"
)

// ErrUnreachable is wrapped by Run's error when the source or the target could not be reached
// (no such host, a refused connection, a timeout: no server answered) before the daemon had ever
// connected to both. A wrong host or port in a URL is then more likely than an outage, and a
// daemon that retried it forever would look like one that works; once the daemon has connected,
// lost connections are retried with backoff instead.
var ErrUnreachable = errors.New("not reached before the daemon ever connected")

// Run is the daemon, `pgconverge run`: it runs sessions (connect, check, prepare the slot, load
// what needs loading, stream) until ctx ends, then returns nil. After a session fails it decides
// (decide) whether to stop, returning the error, or to start the next session: at once after a
// restart on purpose, else after an exponential backoff (up to 30 s, reset after a session that
// lasted a minute), logging the failure at ERROR with a hint. It holds the slot's running lock
// meanwhile (overlap.HoldPresence), across sessions. A server that could not be reached
// before any session connected to both sides stops it with an error wrapping ErrUnreachable. The
// caller validates cfg.
func Run(ctx context.Context, cfg Config) error {
	b := backoff.NewExponentialBackOff()
	// Randomised by ±50 % (the library's default, so that daemons that failed together do not
	// retry together), a wait is at most 30 s.
	b.MaxInterval = knobOr(cfg.Knobs.RetryBackoffMax, 20*time.Second)
	cfg.copyOnly = new(apply.CopyOnlyTables) // one for the daemon's life: a later session stages such tables by COPY too
	cfg.pace = newDaemonPace(cfg)
	watchCtx, stopWatching := context.WithCancel(ctx)
	var watching sync.WaitGroup
	watching.Go(func() { followControls(watchCtx, cfg) })
	watching.Go(func() { watchSourceLoad(watchCtx, cfg) })
	defer watching.Wait()
	defer stopWatching()
	running := overlap.HoldPresence(ctx, cfg.Target, cfg.Slot, cfg.Logger, knobOr(cfg.Knobs.PresenceCheckEvery, overlap.PresenceCheckEvery),
		cfg.Knobs.leaseTimings().CheckTimeout)
	defer running.Release()
	everConnected := false
	for {
		started := time.Now()
		connected, err := runSession(ctx, cfg)
		everConnected = everConnected || connected
		if ctx.Err() != nil {
			cfg.Logger.Info("daemon stopped on request (SIGINT or SIGTERM, or cutover once caught up)", "slot", cfg.Slot)
			return nil
		}
		if !everConnected && unreachable(err) {
			return unreachableError{err}
		}
		d := decide(err)
		if err == nil || d == stop {
			return err
		}
		cfg.monitor().SessionRetried(reason(err))
		if time.Since(started) > time.Minute || d == restart {
			b.Reset()
		}
		wait := b.NextBackOff()
		attrs := []any{"err", err, "retry_in", wait.String()}
		if h := hint(err); h != "" {
			attrs = append(attrs, "hint", h)
		}
		switch {
		case lostLeadership(err):
			cfg.Logger.Warn("lost the leadership of the slot: this daemon stopped writing and waits as a standby", attrs...)
		case d == restart:
			cfg.Logger.Info("restarting the session to follow a change on the source", attrs...)
		default:
			cfg.Logger.Error("session failed, reconnecting", attrs...)
		}
		select {
		case <-ctx.Done():
			cfg.Logger.Info("daemon stopped on request (SIGINT or SIGTERM) while it waited to retry", "slot", cfg.Slot)
			return nil
		case <-time.After(wait):
		}
	}
}

// unreachableError is a server not reached before the daemon ever connected (ErrUnreachable).
type unreachableError struct{ err error }

// Error returns the failed connection and the fix.
func (e unreachableError) Error() string {
	return e.err.Error() + ": no server answered there, and the daemon never connected since it started: check the URL's host and port, and that the server listens there (listen_addresses, port, a firewall); once it has connected, the daemon retries lost connections"
}

// Unwrap returns the failed connection's error.
func (e unreachableError) Unwrap() error { return e.err }

// Is reports whether target is ErrUnreachable.
func (e unreachableError) Is(target error) bool { return target == ErrUnreachable }

// unreachable reports whether err is a failed connection attempt that no server answered: a
// *pgconn.ConnectError without a server's error (an authentication or a missing database is the
// server's answer, and decide stops on it already).
func unreachable(err error) bool {
	var connectErr *pgconn.ConnectError
	var pgErr *pgconn.PgError
	return errors.As(err, &connectErr) && !errors.As(err, &pgErr)
}
