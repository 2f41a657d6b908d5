package engine

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// tombstonePruneEvery is how often the daemon prunes tombstones (Config.TombstoneRetention,
// tombstonePruner).
const tombstonePruneEvery = time.Hour

// tombstonePruner is the session member that deletes, while the session streams, the tombstones
// of the session's tables that no path can need any more. It owns nothing mutable: its own
// goroutine (Run) opens a target connection of its own each round, and asks gate, which the
// unknown-value filler's goroutine sets, whether a fill's snapshot may still need a tombstone.
type tombstonePruner struct {
	target    string
	retention time.Duration // Config.TombstoneRetention
	every     time.Duration // between rounds
	logger    *slog.Logger
	// tables are the streamed tables and those kept by snapshots only, as described at the
	// session's start.
	tables []changebatch.Table
	gate   *fillGate
}

// newTombstonePruner returns the pruner of cfg's session, over the streamed tables and those
// kept by snapshots only, that waits for the fills gate counts.
func newTombstonePruner(cfg Config, streamed, snapshotOnly []changebatch.Table, gate *fillGate) *tombstonePruner {
	every := tombstonePruneEvery
	if cfg.Knobs.TombstonePruneEvery > 0 {
		every = cfg.Knobs.TombstonePruneEvery
	}
	return &tombstonePruner{target: cfg.Target, retention: cfg.TombstoneRetention, every: every, logger: cfg.Logger,
		tables: append(slices.Clone(streamed), snapshotOnly...), gate: gate}
}

// Run deletes the tombstones of the streamed tables (and of those kept by snapshots only, whose
// refreshes leave the copies they replaced) that no path can need any more and that are older
// than Config.TombstoneRetention (pruneTable), every tombstonePruneEvery
// (Knobs.TombstonePruneEvery in tests), starting one interval after the session started. A failure
// is logged at WARN and tried again at the next round: tombstones only cost space. Retention 0
// keeps them. It returns nil when ctx ends.
func (p *tombstonePruner) Run(ctx context.Context) error {
	if p.retention <= 0 {
		return nil
	}
	periodically(ctx, p.every, false, func() {
		if err := p.round(ctx); err != nil && ctx.Err() == nil {
			p.logger.Warn("tombstones not pruned: tried again at the next round", "retention", p.retention.String(), "err", err)
		}
	})
	return nil
}

// round prunes the tombstones of every table once, on a connection of its own; while a fill of
// unknown values is under way it leaves the tables not yet pruned to the next round.
func (p *tombstonePruner) round(ctx context.Context) error {
	conn, err := pgsession.Connect(ctx, p.target, "target")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, t := range p.tables {
		if p.gate.busy() {
			return nil // a fill of unknown values reads an older snapshot: the next round prunes
		}
		n, fence, err := pruneTable(ctx, conn, t, p.retention)
		if err != nil {
			return err
		}
		if n > 0 {
			p.logger.Info("deleted tombstones no path can need any more", "table", t.String(), "rows", n,
				"fence", fence.String(), "retention", p.retention.String())
		}
	}
	return nil
}

// pruneTable raises table t's fence to its tombstone horizon (coverage.TombstoneHorizon) in one
// short transaction, then deletes its tombstones at or below it (apply.PruneTombstones). It
// returns the rows deleted and the fence; nothing when the table has no horizon yet.
func pruneTable(ctx context.Context, conn *pgx.Conn, t changebatch.Table, retention time.Duration) (int64, changebatch.Version, error) {
	var fence changebatch.Version
	var ok bool
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var err error
		if fence, ok, err = coverage.TombstoneHorizon(ctx, tx, t.TableName, retention); err != nil || !ok {
			return err
		}
		return apply.RaiseFenceTx(ctx, tx, t.TableName, fence)
	})
	if err != nil || !ok {
		return 0, fence, err
	}
	n, err := apply.PruneTombstones(ctx, conn, t, fence)
	return n, fence, err
}
