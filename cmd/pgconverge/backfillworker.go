package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"golang.org/x/sync/errgroup"
)

// chunkAttempts bounds how often a chunk is tried when its target transaction loses a deadlock
// or a serialization conflict with the stream.
const chunkAttempts = 3

// backfillWorker reads chunks over its own source connection and applies each in one transaction
// over its own target connection.
type backfillWorker struct {
	source    string // URL, to reconnect
	src, tgt  *pgx.Conn
	ap        *apply.Applier
	snap      backfill.Snapshot
	batchRows int
	log       *slog.Logger
}

// chunkDone is what applying one chunk did.
type chunkDone struct {
	rows   int64
	result apply.Result
	// reread is true when an interrupted run had started this chunk before.
	reread bool
}

func newBackfillWorker(ctx context.Context, job backfillJob, snap backfill.Snapshot) (*backfillWorker, error) {
	src, err := pgsession.Connect(ctx, job.Source, "source")
	if err != nil {
		return nil, err
	}
	tgt, err := pgsession.Connect(ctx, job.Target, "target")
	if err != nil {
		src.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return &backfillWorker{source: job.Source, src: src, tgt: tgt, ap: apply.New(tgt), snap: snap, batchRows: job.BatchRows, log: job.Logger}, nil
}

func (w *backfillWorker) close() {
	ctx := context.Background()
	w.src.Close(ctx)
	w.tgt.Close(ctx)
}

// chunk reads and applies cw, retrying a transaction that lost a deadlock or serialization
// conflict, and counts it completed in its table. It first tries the direct COPY unless that
// met existing keys of the table maxDirectConflicts times in this run; when the target holds
// keys of the chunk, the chunk is read again and merged.
func (w *backfillWorker) chunk(ctx context.Context, cw chunkWork) (chunkDone, error) {
	before, err := apply.StartChunk(ctx, w.tgt, cw.tr.id, cw.ordinal)
	if err != nil {
		return chunkDone{}, err
	}
	cw.tr.mu.Lock()
	direct := cw.tr.directConflicts < maxDirectConflicts
	cw.tr.mu.Unlock()
	for attempt := 1; ; {
		done, err := w.applyChunk(ctx, cw, direct)
		if err == nil {
			done.reread = before > 0
			cw.tr.mu.Lock()
			cw.tr.open--
			cw.tr.rows += done.rows
			cw.tr.mu.Unlock()
			return done, nil
		}
		if errors.Is(err, errKeysPresent) {
			cw.tr.mu.Lock()
			cw.tr.directConflicts++
			cw.tr.mu.Unlock()
			direct = false
			continue
		}
		var pgErr *pgconn.PgError
		if attempt == chunkAttempts || !errors.As(err, &pgErr) || (pgErr.Code != "40P01" && pgErr.Code != "40001") {
			return chunkDone{}, err
		}
		w.log.Warn("chunk lost a conflict with a concurrent writer, reading it again", "table", cw.tr.t.String(),
			"chunk", cw.ordinal, "attempt", attempt, "err", err)
		attempt++
	}
}

// maxDirectConflicts is how often the direct COPY of a table's chunks may meet keys the target
// already holds before a run merges every further chunk of the table: a table the target already
// holds (a repair) then costs three aborted copies, an empty one never pays for the merge.
const maxDirectConflicts = 3

// errKeysPresent says the target already holds keys of a chunk the direct COPY tried to insert.
var errKeysPresent = errors.New("the target holds keys of the chunk")

// applyChunk reads chunk cw from the snapshot and applies it, with its ledger row, in one target
// transaction: by direct COPY (failing with errKeysPresent when the target holds any of its keys)
// or by merging each batch. Reading and applying overlap: the reader runs at most two batches
// ahead.
func (w *backfillWorker) applyChunk(ctx context.Context, cw chunkWork, direct bool) (chunkDone, error) {
	var done chunkDone
	if w.src.IsClosed() {
		// Stopping the reader of an aborted direct COPY mid-query closes its connection.
		src, err := pgsession.Connect(ctx, w.source, "source")
		if err != nil {
			return done, err
		}
		w.src = src
	}
	tx, err := w.ap.Begin(ctx)
	if err != nil {
		return done, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	batches := make(chan arrow.RecordBatch, 2)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(batches)
		var err error
		done.rows, err = backfill.ReadChunk(gctx, w.src, w.snap, cw.tr.t, cw.chunk, w.batchRows, func(ctx context.Context, rec arrow.RecordBatch) error {
			rec.Retain()
			select {
			case batches <- rec:
				return nil
			case <-ctx.Done():
				rec.Release()
				return ctx.Err()
			}
		})
		return err
	})
	g.Go(func() error {
		if direct {
			res, conflict, err := tx.CopySnapshot(gctx, cw.tr.t, batches)
			if conflict {
				return errKeysPresent
			}
			done.result = res
			return err
		}
		for rec := range batches {
			res, err := tx.ApplySnapshot(gctx, rec)
			rec.Release()
			if err != nil {
				return err
			}
			done.result.Add(res)
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return done, err
	}
	if err := apply.CompleteChunk(ctx, tx.Conn(), cw.tr.id, cw.ordinal, w.snap.LSN, done.rows); err != nil {
		return done, err
	}
	return done, tx.Commit(ctx)
}

// finishIfComplete completes tr's backfill once its plan is complete and every chunk completed:
// in one transaction it records the table backfilled at the smallest S of its chunks, raises the
// table's fence to that S and turns every live row older than it into a tombstone (a row no chunk
// read: the source had deleted it), unless tr.unwritten says there can be none. It returns how many rows it turned, or -1 when tr is not
// complete (or another worker finished it).
func (w *backfillWorker) finishIfComplete(ctx context.Context, tr *tableRun, log *slog.Logger) (int64, error) {
	tr.mu.Lock()
	complete := tr.planned && tr.open == 0 && !tr.finished
	tr.finished = tr.finished || complete
	tr.mu.Unlock()
	if !complete {
		return -1, nil
	}
	tx, err := w.ap.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	s, err := apply.FinishTableBackfill(ctx, tx.Conn(), tr.id)
	if err != nil {
		return 0, err
	}
	var n int64
	if tr.unwritten {
		// Nothing older than S can be there: skip scanning the whole table for it.
		err = tx.RaiseFence(ctx, tr.t, changebatch.Version{LSN: s})
	} else {
		n, err = tx.Fence(ctx, tr.t, changebatch.Version{LSN: s})
	}
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	log.Info("backfilled table", "table", tr.t.String(), "rows", tr.rows, "backfilled_at", s.String(), "tombstoned_absent", n)
	return n, nil
}
