package backfillrun

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// backfillWorker applies chunks one after another, reading each over its own source connection
// while it writes it over its own target connection.
type backfillWorker struct {
	src, tgt  *pgx.Conn
	ap        *apply.Applier
	snap      backfill.Snapshot
	batchRows int
	chunkRows int
	log       *slog.Logger
	// afterMergedBatch is Job.AfterMergedBatch.
	afterMergedBatch func()
	// mon and conflicts count the conflicts the worker lost (retryConflict).
	mon       Monitor
	conflicts *atomic.Int64
	// slot and epoch are Job.LeaderSlot and Epoch.
	slot  string
	epoch int64
	// keepFrom is the smallest S of a chunk another worker completed that the run keeps: chunks
	// of this run's own snapshot, and with Resume those a stream covers from (Job.KeepFrom).
	keepFrom pglogrepl.LSN
	// pacer is Job.Pacer; timeCap Job.ChunkTimeCap.
	pacer   *pacing.Pacer
	timeCap time.Duration
	// runID is set (not 0) in a worker of a process that joined that run (Join): each of its chunk
	// transactions checks the run still owns the chunk's table backfill (coverage.CheckRunOwnsTx).
	runID int64
}

// chunkDone is what applying one chunk did.
type chunkDone struct {
	rows   int64
	result apply.Result
	// reread is true when an interrupted run had started this chunk before.
	reread bool
	// byOther counts the rows of a chunk a worker of another process completed; held is true when
	// such a worker holds the chunk now (neither is applied here).
	byOther int64
	held    bool
}

// newBackfillWorker connects a worker of job reading at snap: its target session holds the worker
// lock and is registered under job's lease, if any.
func newBackfillWorker(ctx context.Context, job Job, snap backfill.Snapshot) (*backfillWorker, error) {
	src, err := pgsession.Connect(ctx, job.Source, "source")
	if err != nil {
		return nil, err
	}
	tgt, err := pgsession.Connect(ctx, job.Target, "target")
	if err == nil {
		err = coverage.HoldWorkerLock(ctx, tgt)
	}
	if err == nil && job.lease != nil {
		err = job.lease.Add(ctx, tgt)
	}
	if err != nil {
		src.Close(context.WithoutCancel(ctx))
		if tgt != nil {
			tgt.Close(context.WithoutCancel(ctx))
		}
		return nil, err
	}
	keepFrom := snap.LSN
	if job.Resume {
		keepFrom = job.KeepFrom
	}
	return &backfillWorker{src: src, tgt: tgt, ap: apply.New(tgt, job.CopyOnly), snap: snap, batchRows: job.BatchRows,
		chunkRows: job.ChunkRows, log: job.Logger, afterMergedBatch: job.AfterMergedBatch, slot: job.LeaderSlot, epoch: job.Epoch,
		keepFrom: keepFrom, mon: job.Monitor, conflicts: job.conflicts, pacer: job.Pacer, timeCap: job.ChunkTimeCap}, nil
}

func (w *backfillWorker) close() {
	ctx := context.Background()
	w.src.Close(ctx)
	w.tgt.Close(ctx)
}

// chunkRead is a chunk being read: its batches arrive on batches, which closes when reading ended;
// wait then returns the rows read or the error.
type chunkRead struct {
	cw      chunkWork
	batches <-chan arrow.RecordBatch
	wait    func() (int64, error)
	// idle, once reading ended, returns how long the reader waited for the pacer and for the
	// consumer rather than for the source.
	idle func() time.Duration
	// limit is the most rows it reads (the table's readLimit), 0 for the whole rest.
	limit int
}

// read starts reading chunk cw over conn in a goroutine, at most two batches ahead of the
// consumer.
func (w *backfillWorker) read(ctx context.Context, conn *pgx.Conn, cw chunkWork) chunkRead {
	batches := make(chan arrow.RecordBatch, 2)
	ended := make(chan struct{})
	var rows int64
	var err error
	batchRows := w.batchRows
	if cw.tr.t.Keyless {
		// A keyless table is one chunk, merged a batch per target transaction: batches of at
		// most a chunk's rows keep each transaction as short as a keyed table's chunk.
		batchRows = min(batchRows, w.chunkRows)
	}
	rest := cw.rest()
	rest.Limit = cw.readLimit()
	var idle time.Duration
	go func() {
		defer close(ended)
		defer close(batches)
		rows, err = backfill.ReadChunk(ctx, conn, w.snap, cw.tr.t, rest, batchRows, func(ctx context.Context, rec arrow.RecordBatch) error {
			began := time.Now()
			defer func() { idle += time.Since(began) }()
			if err := w.pacer.Take(ctx, rec.NumRows(), recordBytes(rec)); err != nil {
				return err
			}
			rec.Retain()
			select {
			case batches <- rec:
				return nil
			case <-ctx.Done():
				rec.Release()
				return ctx.Err()
			}
		})
	}()
	return chunkRead{cw: cw, batches: batches, wait: func() (int64, error) { <-ended; return rows, err }, limit: rest.Limit,
		idle: func() time.Duration { <-ended; return idle }}
}

// run applies the chunks of work until it closes, calling onDone after each; a chunk a worker of
// another process holds is left in its table's held list (tableRun.held).
func (w *backfillWorker) run(ctx context.Context, work <-chan chunkWork, onDone func(chunkWork, chunkDone) error) error {
	for cw := range work {
		if err := w.pacer.Wait(ctx); err != nil {
			return err
		}
		done, err := w.chunk(ctx, cw)
		if err != nil {
			return err
		}
		if done.held {
			cw.tr.mu.Lock()
			cw.tr.held = append(cw.tr.held, cw)
			cw.tr.mu.Unlock()
			continue
		}
		if err := onDone(cw, done); err != nil {
			return err
		}
	}
	return nil
}

// chunk claims chunk cw (coverage.ClaimChunk) and applies it (applyChunk). A chunk a worker of
// another process (Join) completed counts as completed, unless its S is below w.keepFrom (then it
// is read again); one such a worker holds now is left to it (chunkDone.held).
func (w *backfillWorker) chunk(ctx context.Context, cw chunkWork) (chunkDone, error) {
	for {
		c, err := coverage.ClaimChunk(ctx, w.tgt, cw.tr.id, cw.ordinal)
		switch {
		case err != nil:
			return chunkDone{}, err
		case c.Got:
			return w.applyChunk(ctx, cw, c.Before)
		case !c.Completed:
			return chunkDone{held: true}, nil
		case c.S < w.keepFrom:
			// A worker of an earlier run completed it from a snapshot older than the stream covers.
			if err := coverage.ResetChunk(ctx, w.tgt, cw.tr.id, cw.ordinal); err != nil {
				return chunkDone{}, err
			}
			cw.doneKey = nil
			continue
		}
		cw.tr.mu.Lock()
		cw.tr.open--
		cw.tr.rows += c.Rows
		cw.tr.mu.Unlock()
		return chunkDone{byOther: c.Rows}, nil
	}
}

// applyChunk applies chunk cw, which the worker claimed after before earlier attempts, retrying
// after a lost deadlock or serialization conflict, and counts it completed in its table. It first
// tries the direct COPY, unless that met existing keys of the table maxDirectConflicts times in
// this run; when the target holds keys of the chunk, the chunk is read again and merged batch by
// batch.
func (w *backfillWorker) applyChunk(ctx context.Context, cw chunkWork, before int) (chunkDone, error) {
	var err error
	cw.tr.mu.Lock()
	// A keyless table's rows are always merged: each snapshot row is matched with the deletes
	// the stream already applied (apply's keyless base).
	direct := cw.tr.directConflicts < maxDirectConflicts && !cw.tr.t.Keyless && cw.tr.readLimit == 0
	cw.tr.mu.Unlock()
	var total chunkDone
	for attempt := 1; ; {
		var done chunkDone
		if direct {
			done, err = w.copyChunk(ctx, cw)
		} else {
			done, err = w.mergeChunk(ctx, &cw)
		}
		total.rows += done.rows
		total.result.Add(done.result)
		if err == nil {
			total.reread = before > 0
			cw.tr.mu.Lock()
			cw.tr.open--
			cw.tr.rows += total.rows
			cw.tr.mu.Unlock()
			return total, nil
		}
		switch {
		case errors.Is(err, errKeysPresent):
			cw.tr.mu.Lock()
			cw.tr.directConflicts++
			cw.tr.mu.Unlock()
			direct = false
		case w.retryConflict(ctx, cw.tr.t.String(), "chunk "+strconv.Itoa(cw.ordinal)+" (the rest of it is read again)", attempt, err):
			attempt++
		default:
			return chunkDone{}, err
		}
	}
}

// drain releases the rest of r's batches and waits for its reader to end.
func drain(r chunkRead) {
	for rec := range r.batches {
		rec.Release()
	}
	r.wait()
}

// maxDirectConflicts is how often the direct COPY of a table's chunks may meet keys the target
// already holds before a run merges every further chunk of the table: a table the target already
// holds (a repair) then costs three aborted copies, an empty one never pays for the merge.
const maxDirectConflicts = 3

// errKeysPresent says the target already holds keys of a chunk the direct COPY tried to insert.
var errKeysPresent = errors.New("the target holds keys of the chunk")

// beginChunkTx starts a target transaction for backfill rows. Its commit does not wait for the WAL
// flush: the rows commit with their ledger row and nothing outside the target learns of the
// commit, so if a crash loses it they are simply read again; the daemon's progress commits, which
// must wait, flush it along with theirs. A daemon's chunk transaction checks its leader epoch, and
// a joined worker's that the run still owns table backfill id.
func (w *backfillWorker) beginChunkTx(ctx context.Context, id int64) (*apply.Tx, error) {
	tx, err := w.ap.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Conn().Exec(ctx, `set local synchronous_commit = off`); err != nil {
		tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	if w.epoch != 0 {
		if err := apply.CheckLeaderTx(ctx, tx.Conn(), w.slot, w.epoch); err != nil {
			tx.Rollback(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	if w.runID != 0 {
		if err := coverage.CheckRunOwnsTx(ctx, tx.Conn(), id, w.runID); err != nil {
			tx.Rollback(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return tx, nil
}

// copyChunk copies chunk cw from the source's COPY output straight into the target table with
// one COPY (apply.Tx.CopySnapshotRows), in one target transaction together with the chunk's
// ledger row; it fails with errKeysPresent when the target holds any of the chunk's keys.
func (w *backfillWorker) copyChunk(ctx context.Context, cw chunkWork) (chunkDone, error) {
	var done chunkDone
	tx, err := w.beginChunkTx(ctx, cw.tr.id)
	if err != nil {
		return done, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	t := cw.tr.t
	began := time.Now()
	var paced *pacing.Writer
	res, rows, conflict, err := tx.CopySnapshotRows(ctx, t, changebatch.Version{LSN: w.snap.LSN}, pgsession.MajorVersion(w.src.PgConn()), func(out io.Writer, binary bool) (int64, error) {
		// Inside the target transaction only the rate limits apply: the worker waited for the
		// holds before the chunk (run).
		paced = w.pacer.Writer(ctx, out)
		n, err := backfill.CopyChunk(ctx, w.src, w.snap, t, cw.rest(), binary, paced)
		if err == nil {
			err = paced.Flush()
		}
		return n, err
	})
	switch {
	case err != nil:
		return done, err
	case conflict:
		return done, errKeysPresent
	}
	w.checkTimeCap(cw, time.Since(began)-paced.Waited(), rows)
	if err := coverage.ChunkProgress(ctx, tx.Conn(), cw.tr.id, cw.ordinal, w.snap.LSN, nil, rows, true); err != nil {
		return done, err
	}
	if err := tx.Commit(ctx); err != nil {
		return done, err
	}
	return chunkDone{rows: rows, result: res}, nil
}

// mergeChunk reads the rest of chunk *cw and applies its batches through the merge of the apply
// step, each batch in its own short target transaction with the chunk's progress (its last key),
// so that rows the stream is also writing are locked only briefly; *cw follows the progress, and
// the chunk is recorded completed after its last batch. Once the table's reads are split
// (readLimit), the rest is read in parts of at most that many rows, each continuing after the
// last key applied.
func (w *backfillWorker) mergeChunk(ctx context.Context, cw *chunkWork) (chunkDone, error) {
	var done chunkDone
	for {
		began := time.Now()
		r := w.read(ctx, w.src, *cw)
		n, err := w.mergeRead(ctx, r, cw, &done)
		if err != nil {
			return done, err
		}
		w.checkTimeCap(*cw, time.Since(began)-r.idle(), n)
		if r.limit == 0 || n < int64(r.limit) {
			break
		}
	}
	tx, err := w.beginChunkTx(ctx, cw.tr.id)
	if err != nil {
		return done, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := coverage.ChunkProgress(ctx, tx.Conn(), cw.tr.id, cw.ordinal, w.snap.LSN, nil, 0, true); err != nil {
		return done, err
	}
	return done, tx.Commit(ctx)
}

// mergeRead applies every batch of r (mergeBatch) and returns the rows r read.
func (w *backfillWorker) mergeRead(ctx context.Context, r chunkRead, cw *chunkWork, done *chunkDone) (int64, error) {
	defer drain(r)
	keys := cw.tr.t.KeyOrder()
	for rec := range r.batches {
		err := w.mergeBatch(ctx, rec, cw, keys, done)
		rec.Release()
		if err != nil {
			return 0, err
		}
	}
	return r.wait()
}

// mergeBatch applies one batch of chunk *cw in its own transaction and moves the chunk's progress
// to the batch's last key.
func (w *backfillWorker) mergeBatch(ctx context.Context, rec arrow.RecordBatch, cw *chunkWork, keys []int, done *chunkDone) error {
	v, err := changebatch.NewView(rec)
	if err != nil || v.Len() == 0 {
		return err
	}
	// A keyless table's chunk has no key to resume after, and a block chunk is read in no key
	// order: an interrupted one is read again whole from a new snapshot (its progress is reset).
	var last []string
	if !cw.chunk.ByBlock {
		for _, k := range keys {
			last = append(last, v.Value(v.Len()-1, k).Text)
		}
	}
	tx, err := w.beginChunkTx(ctx, cw.tr.id)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	res, err := tx.ApplySnapshot(ctx, rec)
	if err != nil {
		return err
	}
	n := int64(v.Len())
	if err := coverage.ChunkProgress(ctx, tx.Conn(), cw.tr.id, cw.ordinal, w.snap.LSN, last, n, false); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	cw.doneKey = last
	done.rows += n
	done.result.Add(res)
	if w.afterMergedBatch != nil {
		w.afterMergedBatch()
	}
	return nil
}

// recordBytes returns the bytes of rec's buffers (its columns', their children's included): what
// a batch counts against a bytes-per-second limit.
func recordBytes(rec arrow.RecordBatch) int64 {
	var n int64
	for _, col := range rec.Columns() {
		n += dataBytes(col.Data())
	}
	return n
}

// dataBytes returns the bytes of d's buffers and its children's.
func dataBytes(d arrow.ArrayData) int64 {
	var n int64
	for _, b := range d.Buffers() {
		if b != nil {
			n += int64(b.Len())
		}
	}
	for _, c := range d.Children() {
		n += dataBytes(c)
	}
	return n
}
