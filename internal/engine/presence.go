package engine

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// presence holds a daemon's running lock (apply.MarkRunning) on a target connection of its own for
// as long as Run runs, across its sessions and the backoff between them: daemons of other slots
// then see it running while it reconnects after an error, and take none of the tables it follows
// (overlap.go). A killed process, or one whose connection broke, holds nothing.
type presence struct {
	cfg    Config
	mu     sync.Mutex // held by check
	conn   *pgx.Conn  // holds the lock; nil while it could not be taken
	warned bool       // the last failure was logged
	first  sync.WaitGroup
	stop   func()
}

// presenceCheckEvery is how often the presence connection is checked, and reconnected (the lock
// taken again) when it failed; lease.CheckTimeout bounds each check and each connection attempt.
const presenceCheckEvery = 2 * time.Second

// holdPresence takes the running lock of cfg.Slot on a new target connection in a goroutine, and
// keeps it (check, every presenceCheckEvery) until Release. A lock it could not hold is logged at
// WARN, once until it holds it again; not at the first try (the target cannot be reached: the
// sessions report that).
func holdPresence(ctx context.Context, cfg Config) *presence {
	p := &presence{cfg: cfg, warned: true}
	every := presenceCheckEvery
	if cfg.Knobs.PresenceCheckEvery > 0 {
		every = cfg.Knobs.PresenceCheckEvery
	}
	p.first.Add(1)
	go func() {
		defer p.first.Done()
		p.check(ctx)
	}()
	p.stop = lease.Every(ctx, every, p.check)
	return p
}

// Release stops the checks and closes the presence connection, releasing the running lock.
func (p *presence) Release() {
	p.stop()
	p.first.Wait()
	if p.conn != nil {
		p.conn.Close(context.Background())
	}
}

// check makes sure the presence connection answers, replacing it when it does not (or is nil).
func (p *presence) check(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var err error
	if p.conn != nil {
		cctx, cancel := context.WithTimeout(ctx, p.cfg.Knobs.leaseTimings().CheckTimeout)
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
		p.cfg.Logger.Warn("could not hold this daemon's running lock on the target: while it is not held, a daemon of another slot may take the tables this one follows; retrying every 2 s",
			"slot", p.cfg.Slot, "err", err)
		p.warned = true
	}
}

// take connects to the target and takes the running lock.
func (p *presence) take(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Knobs.leaseTimings().CheckTimeout)
	defer cancel()
	conn, err := pgsession.Connect(cctx, p.cfg.Target, "target")
	if err != nil {
		return nil, err
	}
	if err := apply.MarkRunning(cctx, conn, p.cfg.Slot); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}
