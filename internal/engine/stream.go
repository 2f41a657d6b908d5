package engine

import (
	"cmp"
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"golang.org/x/sync/errgroup"
)

// stream runs the session's streaming phase under one errgroup until ctx ends or one of its
// goroutines fails: the streamer (which owns the replication connection and applies through
// applyStream), the catalog watcher (catalogWatcher: the source's WAL position every second, the
// catalog checks every 5 s, on the session's source connection), the backfill and verify
// schedules, the audit and tombstone pruners (tombstonePruner), the unknown-value filler
// (unknownFiller), the gap metric's publisher (gapPublisher) and, while the session leaves tables
// to daemons of other slots, overlap.Watch. The first error ends them all and is returned; the
// watchers' errors are typed (errMembershipChanged, errEnumChanged, *cdc.SchemaChangeError,
// overlap.ErrFollowerStopped) so that decide can tell a restart on purpose from a failure. A schema
// change that needs a reload is recorded before the session ends.
func (s *session) stream(ctx context.Context, start, describedAt pglogrepl.LSN) error {
	cfg := s.cfg
	var walEnd atomic.Uint64
	// The watcher raises limit; the stream confirms the slot no further, and records it.
	var limit confirmLimit
	s.confirmer = &spanConfirmer{slot: cfg.Slot, names: s.names, limit: &limit}
	// The stream's setup, START_REPLICATION and the watcher's checks have the session's statement
	// deadline; the applies do not.
	if err := s.readWALEnd(s.bounded(ctx), &walEnd); err != nil {
		return err
	}
	fences, err := s.reloadFences(s.bounded(ctx))
	if err != nil {
		return err
	}
	streamer, err := cdc.NewStreamer(cdc.StreamConfig{
		Slot: cfg.Slot, Publication: cfg.Publication, Start: start, Tables: s.tables, DescribedAt: describedAt,
		ReloadFences: fences, Apply: s.applyStream, Logger: cfg.Logger, Knobs: cfg.Knobs.Stream, StatusInterval: cfg.Knobs.StatusInterval,
		MaxPendingBytes: int(max(cmp.Or(cfg.MemoryBudget, DefaultMemoryBudget)/16, 1<<20)),
		SourceWALEnd:    func() pglogrepl.LSN { return pglogrepl.LSN(walEnd.Load()) },
		// The slot is confirmed only as far as the catalog checks vouch for (catalogWatcher).
		ConfirmLimit: limit.get,
		CheckStart:   func(ctx context.Context) error { return s.checkSlotStart(ctx, start) },
		StartBound:   func(ctx context.Context) (context.Context, func()) { return pgsession.Call(s.bounded(ctx), "source") },
	})
	if err != nil {
		return permanent(err)
	}
	// A joined backfill worker that froze holding rows the stream writes is ended after the lease,
	// also when the run it joined has died.
	stopWatch, err := lease.WatchWorkers(s.bounded(ctx), cfg.Target, cfg.Logger)
	if err != nil {
		return err
	}
	defer stopWatch()
	s.mon.FollowStream(func() StreamStats { return streamStats(streamer.Stats()) })
	defer s.mon.FollowStream(nil)
	g, gctx := errgroup.WithContext(ctx)
	watcher := &catalogWatcher{s: s, walEnd: &walEnd, limit: &limit}
	g.Go(func() error { return watcher.Run(s.bounded(gctx)) })
	g.Go(func() error { return s.runSchedule(gctx, start) })
	g.Go(func() error { return s.runVerifySchedule(gctx) })
	waits := s.overlapWatch()
	g.Go(func() error { return waits.Run(gctx) })
	g.Go(func() error { return s.pruneAudit(gctx) })
	// The filler tells the pruner, through gate, when a fill's snapshot may need a tombstone.
	var gate fillGate
	s.filler = newUnknownFiller(cfg, s.tables, &gate)
	g.Go(func() error { return newTombstonePruner(cfg, s.tables, s.snapshotOnly, &gate).Run(gctx) })
	g.Go(func() error { return s.filler.Run(gctx) })
	gaps := &gapPublisher{cfg: cfg, mon: s.mon, tables: s.tables, bound: s.bounded}
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

// applyStream is the stream's ApplyFunc: one target transaction with the batches, the progress
// and, every few seconds, the position up to which the tables' publication membership is
// confirmed (spanConfirmer). It reads no ledger table in full: the gap metric is gapPublisher's.
func (s *session) applyStream(ctx context.Context, batches []arrow.RecordBatch, end pglogrepl.LSN) error {
	began := time.Now()
	tx, err := s.ap.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// The fences, the progress and the merges of small batches share one round trip.
	results, err := tx.ApplyGroup(ctx, batches, apply.Progress{Slot: s.cfg.Slot, LSN: end, Epoch: s.epoch})
	if err != nil {
		return err
	}
	rows := map[string]backfillrun.RowCounts{}
	var replays []coverage.SuppressedReplay
	var unknown map[string][][]string // table → keys left with unknown values
	for i, b := range batches {
		res := results[i]
		tab, err := changebatch.TableOf(b.Schema())
		if err != nil {
			return err
		}
		r := rows[tab.String()]
		r.Applied, r.Suppressed = r.Applied+res.Applied, r.Suppressed+res.Suppressed
		rows[tab.String()] = r
		if len(res.Unknown) > 0 {
			if unknown == nil {
				unknown = map[string][][]string{}
			}
			unknown[tab.String()] = append(unknown[tab.String()], res.Unknown...)
		}
		if replays, err = s.noteReplay(replays, tab.TableName, b, res.Suppressed); err != nil {
			return err
		}
	}
	// The audit of what had no effect is written in the transaction it describes (tables with
	// nothing suppressed are left out).
	if err := coverage.RecordSuppressedReplays(ctx, tx.Conn(), replays); err != nil {
		return err
	}
	confirmed, err := s.confirmer.record(ctx, tx.Conn())
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	s.confirmer.committed(confirmed)
	s.filler.note(unknown)
	s.mon.StreamApplied(rows, time.Since(began))
	if len(batches) > 0 {
		s.cfg.Logger.Debug("applied", "lsn", end.String(), "applied", tx.Result.Applied,
			"suppressed", tx.Result.Suppressed, "merged", tx.Result.Merged, "truncates", tx.Result.Truncates)
	}
	return nil
}

// noteReplay adds batch b of table t, of whose rows suppressed had no effect, to t's entry of
// replays: its rows offered, rows suppressed and the LSN range of its versions.
func (s *session) noteReplay(replays []coverage.SuppressedReplay, t changebatch.TableName, b arrow.RecordBatch, suppressed int64) ([]coverage.SuppressedReplay, error) {
	v, err := changebatch.NewView(b)
	if err != nil {
		return replays, err
	}
	first, last := v.LSNRange()
	for i := range replays {
		if r := &replays[i]; r.Table == t {
			r.First, r.Last = min(r.First, first), max(r.Last, last)
			r.Offered, r.Suppressed = r.Offered+int64(v.Len()), r.Suppressed+suppressed
			return replays, nil
		}
	}
	return append(replays, coverage.SuppressedReplay{Path: coverage.ReplayStream, Slot: s.cfg.Slot, Table: t,
		First: first, Last: last, Offered: int64(v.Len()), Suppressed: suppressed}), nil
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
