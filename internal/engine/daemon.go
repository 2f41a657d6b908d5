package engine

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Run is the daemon, `pgconverge run`: it runs sessions (connect, check, prepare the slot, load
// what needs loading, stream) until ctx ends, then returns nil. After a session fails it decides
// (decide) whether to stop, returning the error, or to start the next session: at once after a
// restart on purpose, else after an exponential backoff (up to 30 s, reset after a session that
// lasted a minute), logging the failure at ERROR with a hint. The caller validates cfg.
func Run(ctx context.Context, cfg Config) error {
	b := backoff.NewExponentialBackOff()
	b.MaxInterval = 30 * time.Second
	for {
		started := time.Now()
		err := runSession(ctx, cfg)
		if ctx.Err() != nil {
			cfg.Logger.Info("daemon stopped on request (SIGINT or SIGTERM)", "slot", cfg.Slot)
			return nil
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
		if d == restart {
			cfg.Logger.Warn("restarting the session", attrs...)
		} else {
			cfg.Logger.Error("session failed, reconnecting", attrs...)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}
