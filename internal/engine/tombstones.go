package engine

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// tombstonePruneEvery is how often the daemon prunes tombstones (Config.TombstoneRetention).
const tombstonePruneEvery = time.Hour

// pruneTombstones deletes, while the session streams, the tombstones of the streamed tables (and of
// those kept by snapshots only, whose refreshes leave the copies they replaced) that
// no path can need any more and that are older than Config.TombstoneRetention (pruneTable), every
// tombstonePruneEvery (Knobs.TombstonePruneEvery in tests), starting one interval after the
// session started, on a connection of its own. A failure is logged at WARN and tried again at the
// next round: tombstones only cost space. Retention 0 keeps them.
func (s *session) pruneTombstones(ctx context.Context) error {
	if s.cfg.TombstoneRetention <= 0 {
		return nil
	}
	every := tombstonePruneEvery
	if s.cfg.Knobs.TombstonePruneEvery > 0 {
		every = s.cfg.Knobs.TombstonePruneEvery
	}
	periodically(ctx, every, false, func() {
		if err := s.pruneRound(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("tombstones not pruned: tried again at the next round", "retention", s.cfg.TombstoneRetention.String(), "err", err)
		}
	})
	return nil
}

// pruneRound prunes the tombstones of every streamed table once.
func (s *session) pruneRound(ctx context.Context) error {
	conn, err := pgsession.Connect(ctx, s.cfg.Target, "target")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, t := range append(slices.Clone(s.tables), s.snapshotOnly...) {
		if s.filling.Load() > 0 {
			return nil // a fill of unknown values reads an older snapshot: the next round prunes
		}
		n, fence, err := pruneTable(ctx, conn, t, s.cfg.TombstoneRetention)
		if err != nil {
			return err
		}
		if n > 0 {
			s.cfg.Logger.Info("deleted tombstones no path can need any more", "table", t.String(), "rows", n,
				"fence", fence.String(), "retention", s.cfg.TombstoneRetention.String())
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
