package overlap

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// PresenceCheckEvery is how often the presence connection is checked, and reconnected (the lock
// taken again) when it failed, in production; the lease's check timeout (lease.Timings) bounds
// each check and each connection attempt.
const PresenceCheckEvery = 2 * time.Second

// Presence holds a daemon's running lock (apply.MarkRunning) on a target connection of its own for
// as long as the daemon runs, across its sessions and the backoff between them: daemons of other
// slots then see it running while it reconnects after an error, and take none of the tables it
// follows. A killed process, or one whose connection broke, holds nothing. Release ends it.
type Presence struct {
	target, slot string
	logger       *slog.Logger
	timeout      time.Duration // bounds each check and connection attempt
	mu           sync.Mutex    // held by check
	conn         *pgx.Conn     // holds the lock; nil while it could not be taken
	warned       bool          // the last failure was logged
	first        sync.WaitGroup
	stop         func()
}

// HoldPresence takes the running lock of slot on a new connection to target (a URL) in a
// goroutine, and keeps it (checking the connection every every, a positive duration:
// PresenceCheckEvery in production, each check and connection attempt bounded by timeout:
// lease.CheckTimeout in production) until Release. A lock it could not hold is logged at WARN on
// logger, once until it holds it again; not at the first try (the target cannot be reached: the
// sessions report that).
func HoldPresence(ctx context.Context, target, slot string, logger *slog.Logger, every, timeout time.Duration) *Presence {
	p := &Presence{target: target, slot: slot, logger: logger, timeout: timeout, warned: true}
	p.first.Add(1)
	go func() {
		defer p.first.Done()
		p.check(ctx)
	}()
	p.stop = lease.Every(ctx, every, p.check)
	return p
}

// Release stops the checks and closes the presence connection, releasing the running lock.
func (p *Presence) Release() {
	p.stop()
	p.first.Wait()
	if p.conn != nil {
		p.conn.Close(context.Background())
	}
}

// check makes sure the presence connection answers, replacing it when it does not (or is nil).
func (p *Presence) check(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var err error
	if p.conn != nil {
		cctx, cancel := context.WithTimeout(ctx, p.timeout)
		_, err = p.conn.Exec(cctx, "select 1")
		cancel()
		if err == nil {
			return
		}
		p.conn.Close(context.WithoutCancel(ctx))
		p.conn = nil
	}
	if p.conn, err = p.take(ctx); err == nil {
		p.warned = false
	} else if !p.warned && ctx.Err() == nil {
		p.logger.Warn("could not hold this daemon's running lock on the target: while it is not held, a daemon of another slot may take the tables this one follows; retrying every 2 s",
			"slot", p.slot, "err", err)
		p.warned = true
	}
}

// take connects to the target and takes the running lock.
func (p *Presence) take(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	conn, err := pgsession.Connect(cctx, p.target, "target")
	if err != nil {
		return nil, err
	}
	if err := apply.MarkRunning(cctx, conn, p.slot); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}
