package engine

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// presence holds a daemon's running lock (apply.MarkRunning) on a target connection of its own for
// as long as Run runs, across its sessions and the backoff between them: daemons of other slots
// then see it running while it reconnects after an error, and take none of the tables it follows
// (overlap.go). A killed process, or one whose connection broke, holds nothing.
type presence struct {
	cfg  Config
	stop context.CancelFunc
	done sync.WaitGroup
}

// presenceCheckEvery is how often the presence connection is checked, and reconnected (the lock
// taken again) when it failed; leaderCheckTimeout bounds each check and each connection attempt.
const presenceCheckEvery = 2 * time.Second

// holdPresence takes the running lock of cfg.Slot on a new target connection in a goroutine,
// and keeps it until Release. A lock it could not hold (the target cannot be reached: the sessions
// report that too) is logged at WARN, once until it holds it again.
func holdPresence(ctx context.Context, cfg Config) *presence {
	ctx, stop := context.WithCancel(ctx)
	p := &presence{cfg: cfg, stop: stop}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		p.keep(ctx)
	}()
	return p
}

// Release closes the presence connection, releasing the running lock, and waits for its goroutine.
func (p *presence) Release() {
	p.stop()
	p.done.Wait()
}

// keep takes the lock at once, then checks its connection every presenceCheckEvery, replacing it
// when it failed (or could not be made), until ctx ends.
func (p *presence) keep(ctx context.Context) {
	conn, err := p.take(ctx)
	warned := err != nil // the sessions say why the target cannot be reached
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	every := presenceCheckEvery
	if p.cfg.Knobs.PresenceCheckEvery > 0 {
		every = p.cfg.Knobs.PresenceCheckEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err = nil
		if conn != nil {
			cctx, cancel := context.WithTimeout(ctx, leaderCheckTimeout)
			_, err = conn.Exec(cctx, "select 1")
			cancel()
			if err != nil {
				conn.Close(context.WithoutCancel(ctx))
				conn = nil
			}
		}
		if conn == nil {
			conn, err = p.take(ctx)
		}
		switch {
		case err == nil:
			warned = false
		case !warned && ctx.Err() == nil:
			p.cfg.Logger.Warn("could not hold this daemon's running lock on the target: while it is not held, a daemon of another slot may take the tables this one follows; retrying every 2 s",
				"slot", p.cfg.Slot, "err", err)
			warned = true
		}
	}
}

// take connects to the target and takes the running lock.
func (p *presence) take(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, leaderCheckTimeout)
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
