package engine

import (
	"cmp"
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/staging"
	"golang.org/x/sync/errgroup"
)

// stream runs the session's streaming phase under one errgroup until ctx ends or one of its
// goroutines fails: the streamer (which owns the replication connection and applies through
// streamSink), the catalog watcher (catalogWatcher: the source's WAL position every second, the
// catalog checks every 5 s, on the session's source connection), the backfill and verify
// schedules, the audit and tombstone pruners (auditPruner, tombstonePruner), the unknown-value filler
// (unknownFiller), the gap metric's publisher (gapPublisher) and, while the session leaves tables
// to daemons of other slots, overlap.Watch. The first error ends them all and is returned; the
// watchers' errors are typed (errMembershipChanged, errEnumChanged, *cdc.SchemaChangeError,
// overlap.ErrFollowerStopped) so that decide can tell a restart on purpose from a failure. A schema
// change that needs a reload is recorded before the session ends.
func (s *session) stream(ctx context.Context) error {
	st := s.sessionStart
	cfg, start := st.cfg, st.lsn
	var walEnd atomic.Uint64
	// The watcher raises limit; the stream confirms the slot no further, and records it.
	var limit confirmLimit
	// The filler tells the pruner, through gate, when a fill's snapshot may need a tombstone.
	var gate fillGate
	filler := newUnknownFiller(cfg, st.tables, &gate)
	sink := &streamSink{st: st, mon: s.mon, ap: s.ap, filler: filler,
		confirmer: &spanConfirmer{slot: cfg.Slot, names: st.names, limit: &limit}}
	// The stream's setup, START_REPLICATION and the watcher's checks have the session's statement
	// deadline; the applies do not.
	if err := readWALEnd(s.bounded(ctx), s.src, &walEnd); err != nil {
		return err
	}
	fences, err := s.reloadFences(s.bounded(ctx))
	if err != nil {
		return err
	}
	stager, closeStager, err := s.stager(ctx)
	if err != nil {
		return err
	}
	defer closeStager()
	var cdcStager cdc.Stager
	var applyStreamed cdc.ApplyStreamedFunc
	if stager != nil {
		sink.rows, cdcStager, applyStreamed = stager, stager, sink.applyStreamed
	}
	streamer, err := cdc.NewStreamer(cdc.StreamConfig{
		Stager: cdcStager, ApplyStreamed: applyStreamed,
		Slot: cfg.Slot, Publication: cfg.Publication, Start: start, Tables: st.tables, DescribedAt: st.describedAt,
		ReloadFences: fences, Apply: sink.apply, Logger: cfg.Logger, Knobs: cfg.Knobs.Stream, StatusInterval: cfg.Knobs.StatusInterval,
		MaxPendingBytes: int(max(cmp.Or(cfg.MemoryBudget, DefaultMemoryBudget)/16, 1<<20)),
		SourceWALEnd:    func() pglogrepl.LSN { return pglogrepl.LSN(walEnd.Load()) },
		// The slot is confirmed only as far as the catalog checks vouch for (catalogWatcher).
		ConfirmLimit: limit.get,
		Paused:       cfg.pace.paused,
		CheckStart:   func(ctx context.Context) error { return s.checkSlotStart(ctx, start) },
		StartBound:   func(ctx context.Context) (context.Context, func()) { return pgsession.Call(s.bounded(ctx), "source") },
	})
	if err != nil {
		return permanent(err)
	}
	// A joined backfill worker that froze holding rows the stream writes is ended after the lease,
	// also when the run it joined has died.
	stopWatch, err := lease.WatchWorkers(s.bounded(ctx), cfg.Target, cfg.Knobs.Lease, cfg.Logger)
	if err != nil {
		return err
	}
	defer stopWatch()
	cfg.pace.setStreaming(true)
	defer cfg.pace.setStreaming(false)
	s.mon.FollowStream(func() StreamStats { return streamStats(streamer.Stats()) })
	defer s.mon.FollowStream(nil)
	g, gctx := errgroup.WithContext(ctx)
	watcher := newCatalogWatcher(st, s.mon, s.src, &walEnd, &limit, func() pglogrepl.LSN { return streamer.Stats().Flushed })
	g.Go(func() error { return watcher.Run(s.bounded(gctx)) })
	g.Go(func() error { return backfillSchedules(st, s.mon).Run(gctx) })
	g.Go(func() error { return verifySchedule(cfg, st.tables, s.mon).Run(gctx) })
	g.Go(func() error { return st.overlapWatch(s.mon).Run(gctx) })
	g.Go(func() error { return auditPruner{cfg: cfg}.Run(gctx) })
	g.Go(func() error { return newTombstonePruner(cfg, st.tables, st.snapshotOnly, &gate).Run(gctx) })
	g.Go(func() error { return filler.Run(gctx) })
	g.Go(func() error { return newIndexFollower(cfg, s.mon, st.tables).Run(gctx) })
	gaps := &gapPublisher{cfg: cfg, mon: s.mon, tables: st.tables, bound: s.bounded}
	g.Go(func() error { return gaps.Run(gctx) })
	g.Go(func() error {
		if err := streamer.Run(gctx, s.repl); err != nil {
			return err
		}
		return gctx.Err() // ended with its context: by ctx, or by another goroutine's error
	})
	err = g.Wait()
	if err != nil && ctx.Err() == nil {
		err = s.slotGoneOr(ctx, err)
	}
	var schema *cdc.SchemaChangeError
	if errors.As(err, &schema) {
		attrs := []any{"table", schema.Table.String(), "lsn", schema.LSN.String(), "added", schema.Added,
			"dropped_or_renamed", schema.Dropped, "changed_type", schema.Retyped, "rewritten", schema.Rewritten,
			"key_changed", schema.KeyChanged}
		if schema.Reload {
			attrs = append(attrs, "load_again", "a change streamed against the old columns cannot be written: the table is loaded again")
		}
		cfg.Logger.Warn("source table changed while streaming (columns, key or storage): restarting the session, which brings the target table in line and logs whether its rows are loaded again", attrs...)
		if schema.Reload {
			// The transaction at LSN is left to a backfill read after it.
			if rerr := apply.RecordSchemaChange(s.bounded(context.WithoutCancel(ctx)), s.tgt, schema.Table.TableName, schema.LSN+1, coverage.AbandonBackfills); rerr != nil {
				return rerr
			}
		}
	}
	return err
}

// enumChange is labelsChanged over a connection of its own (the session's may be broken or busy).
func (s *session) enumChange(ctx context.Context) (changed, err error) {
	conn, err := pgsession.Connect(ctx, s.cfg.Source, "source")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return s.labelsChanged(ctx, conn)
}

// stager returns the staging of in-progress transactions the source streams
// (Config.StreamInProgress), on a target connection of its own that the returned func closes;
// nil when the daemon does not ask for them.
func (s *session) stager(ctx context.Context) (*staging.Table, func(), error) {
	if !s.cfg.StreamInProgress {
		return nil, func() {}, nil
	}
	conn, err := pgsession.Connect(ctx, s.cfg.Target, "target")
	if err != nil {
		return nil, nil, err
	}
	st := staging.New(conn, s.cfg.Slot)
	return st, func() {
		st.Close()
		conn.Close(context.WithoutCancel(ctx))
	}, nil
}
