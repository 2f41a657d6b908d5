package engine

import (
	"context"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// auditPruneEvery is how often the daemon deletes suppressed-replay audit rows past their
// retention.
const auditPruneEvery = time.Hour

// auditPruner is the stream's member that deletes the suppressed-replay audit rows older than
// cfg.AuditRetention.
type auditPruner struct{ cfg Config }

// Run deletes the audit rows past their retention when the session starts and then every
// auditPruneEvery, on a connection of its own. A failure is logged and tried again at the next
// tick, never ending the session. It returns nil when ctx ends.
func (s auditPruner) Run(ctx context.Context) error {
	if s.cfg.AuditRetention <= 0 {
		return nil
	}
	periodically(ctx, auditPruneEvery, true, func() {
		if n, err := pruneAuditOnce(ctx, s.cfg.Target, s.cfg.AuditRetention); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("could not delete old suppressed-replay audit rows: tried again in an hour", "retention", s.cfg.AuditRetention.String(), "err", err)
		} else if n > 0 {
			s.cfg.Logger.Info("deleted suppressed-replay audit rows past their retention", "rows", n, "retention", s.cfg.AuditRetention.String())
		}
	})
	return nil
}

// periodically runs round every interval (and once at once when now is set) until ctx ends.
func periodically(ctx context.Context, interval time.Duration, now bool, round func()) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	if now {
		round()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			round()
		}
	}
}

// pruneAuditOnce deletes the audit rows older than retention over a connection to target and
// returns how many it deleted.
func pruneAuditOnce(ctx context.Context, target string, retention time.Duration) (int64, error) {
	conn, err := pgsession.Connect(ctx, target, "target")
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return coverage.PruneSuppressedReplays(ctx, conn, retention)
}
