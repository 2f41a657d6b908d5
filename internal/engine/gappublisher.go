package engine

import (
	"context"
	"time"

	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// gapRefreshEvery is how often the gap metric is recomputed from the ledger while the session
// streams (gapPublisher), which a `pgconverge backfill` next to the daemon may have closed.
const gapRefreshEvery = 30 * time.Second

// gapPublisher is the session member that recomputes the streamed tables' coverage gaps from the
// ledger for the metrics while the session streams, every gapRefreshEvery, on a target connection
// of its own per round (its own goroutine, Run): the ledger is read in full, which the stream's
// commit path does not wait for. It owns nothing mutable; it runs only when the daemon has a
// Monitor.
type gapPublisher struct {
	cfg    Config
	mon    Monitor
	tables []changebatch.Table // the streamed tables, as described at the session's start
	// bound gives each round's statements the session's statement deadline (session.bounded).
	bound func(context.Context) context.Context
}

// Run publishes the gaps every gapRefreshEvery until ctx ends (nil) or a round fails: its error
// ends the session, as a failed read of the ledger does. Without a Monitor it returns nil at once.
func (p *gapPublisher) Run(ctx context.Context) error {
	if p.cfg.Monitor == nil {
		return nil
	}
	tick := time.NewTicker(gapRefreshEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := p.round(p.bound(ctx)); err != nil && ctx.Err() == nil {
			return err
		}
	}
}

// round reads the ledger once over a connection of its own and reports the gaps.
func (p *gapPublisher) round(ctx context.Context) error {
	conn, err := pgsession.Connect(ctx, p.cfg.Target, "target")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return publishGaps(ctx, conn, p.cfg, p.mon, p.tables, false)
}
