package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
)

// backfillJob is one backfill run: every chunk of every table read from one exact snapshot by
// Workers readers in parallel, each chunk applied through the apply step in one target
// transaction together with its ledger row. The daemon's initial load, `pgconverge backfill` and
// scheduled backfills are all such runs. The target tables must exist (apply.EnsureTable).
type backfillJob struct {
	Source, Target string
	Tables         []changebatch.Table
	// Trigger is apply.TriggerInitial, TriggerManual, TriggerSchedule or TriggerGap.
	Trigger string
	// Slot names the slot whose stream follows the tables; "" when none does.
	Slot string
	// Workers is the number of chunks read and applied at once; ChunkRows the rows per chunk;
	// BatchRows the rows per change batch within a chunk.
	Workers, ChunkRows, BatchRows int
	// Snapshot, when set, is an exported snapshot to read from (the caller keeps it importable);
	// otherwise the run exports its own from a temporary slot.
	Snapshot *backfill.Snapshot
	// Resume adopts each table's interrupted backfill: its completed chunks with an S at or above
	// KeepFrom stay, the rest are read again.
	Resume   bool
	KeepFrom pglogrepl.LSN
	// Busy says what to do when another process backfills a table: wait for it, skip the table, or
	// fail (the default).
	Busy busyPolicy
	// SnapshotWarn is how long the run may hold its snapshot before it warns (it holds back VACUUM
	// on the source); 0 never warns.
	SnapshotWarn time.Duration
	Logger       *slog.Logger
	Progress     progress
	// AfterChunk is a test hook run after each committed chunk with the table and rows so far;
	// AfterMergedBatch after each committed batch of a merged chunk.
	AfterChunk       func(table string, rows int64)
	AfterMergedBatch func()
	// Metrics counts the rows applied; nil counts nothing.
	Metrics *metrics
	// SourceID identifies the source database (cdc.SourceID); runBackfill reads it.
	SourceID string
}

// busyPolicy is what a backfill does with a table another backfill holds.
type busyPolicy int

const (
	busyFail busyPolicy = iota
	busyWait
	busySkip
)

// backfillReport sums up a run.
type backfillReport struct {
	RunID    int64
	Snapshot pglogrepl.LSN
	// Rows were read from the source in this run; Reread of them are in chunks an interrupted
	// run had started; Kept rows were applied by interrupted runs and kept.
	Rows, Reread, Kept int64
	Result             apply.Result
	// Tombstoned counts live target rows the source no longer had, turned into tombstones.
	Tombstoned int64
	// Tables lists the tables backfilled, each at the smallest S of its chunks.
	Tables  []tableResult
	Skipped []string
	// Sequences are the outcomes of --sync-sequences after the run, nil without it.
	Sequences []sequenceLine
}

// tableResult is one table of a completed run.
type tableResult struct {
	Table        string
	BackfilledAt pglogrepl.LSN
	Rows         int64
}

// tableRun is the state of one table in a run.
type tableRun struct {
	t        changebatch.Table
	id       int64
	mu       sync.Mutex
	adopted  bool // an interrupted backfill resumed by this run
	planned  bool
	open     int // chunks planned or adopted and not completed yet
	finished bool
	rows     int64 // rows of the completed chunks
	// directConflicts counts chunks whose direct COPY met keys the target held.
	directConflicts int
	// result is set when the table's backfill completed.
	result *tableResult
	// unwritten is true when, as the run took the table's backfill lock, its target table was empty
	// and no stream wrote it (apply.Unwritten): every row it holds at the end came from this run.
	unwritten bool
}

// chunkWork is one chunk for a worker.
type chunkWork struct {
	tr      *tableRun
	ordinal int
	chunk   backfill.Chunk
	// doneKey is the last key of the chunk already applied (by batches of an earlier attempt),
	// nil when none is; the rest of the chunk is (doneKey, chunk.Upper].
	doneKey []string
}

// rest returns the part of the chunk still to read.
func (cw chunkWork) rest() backfill.Chunk {
	if cw.doneKey == nil {
		return cw.chunk
	}
	return backfill.Chunk{Lower: cw.doneKey, Upper: cw.chunk.Upper}
}

// runBackfill runs job and returns its report. On an error the run is recorded as failed, on a
// cancelled ctx as interrupted; either way what it completed stays for the next run to resume.
func runBackfill(ctx context.Context, job backfillJob) (rep backfillReport, err error) {
	log := job.Logger
	ctrl, err := pgsession.Connect(ctx, job.Target, "target")
	if err != nil {
		return rep, err
	}
	defer ctrl.Close(context.WithoutCancel(ctx))
	defer func() {
		// Release the backfill locks now: a closed session's locks outlive it until its backend
		// exits, which a next backfill of the same tables must not have to wait for.
		ctrl.Exec(context.WithoutCancel(ctx), `select pg_advisory_unlock_all()`)
	}()
	if job.SourceID, err = sourceID(ctx, job.Source); err != nil {
		return rep, err
	}
	tables, err := lockTables(ctx, ctrl, job, &rep)
	if err != nil || len(tables) == 0 {
		return rep, err
	}
	if rep.RunID, err = apply.StartRun(ctx, ctrl, job.Trigger, job.Slot, job.Workers, job.ChunkRows); err != nil {
		return rep, err
	}
	defer func() {
		// A cancellation during a query closes the connection (pgx); record the end over a new one.
		conn, ectx := ctrl, context.WithoutCancel(ctx)
		if conn.IsClosed() {
			c, e := pgsession.Connect(ectx, job.Target, "target")
			if e != nil {
				log.Error("record the end of the backfill run", "run", rep.RunID, "err", e)
				return
			}
			defer c.Close(ectx)
			conn = c
		}
		if e := apply.EndRun(ectx, conn, rep.RunID, rep.Rows, rep.Reread, err); e != nil {
			if err == nil {
				err = e
			} else {
				log.Error("record the end of the backfill run", "run", rep.RunID, "err", e)
			}
		}
		// Chunks read before a rewrite or TRUNCATE of the source table may hold rows it no longer
		// has: the next run starts the table over instead of resuming.
		if errors.Is(err, backfill.ErrRewritten) {
			if e := apply.AbandonRun(ectx, conn, rep.RunID); e != nil {
				log.Error("abandon the backfills of a run stopped by a rewrite", "run", rep.RunID, "err", e)
			}
		}
	}()
	snap := job.Snapshot
	if snap == nil {
		exp, err := backfill.Export(ctx, job.Source)
		if err != nil {
			return rep, err
		}
		defer exp.Close(context.WithoutCancel(ctx)) // drops the temporary slot
		snap = &exp.Snapshot
	}
	rep.Snapshot = snap.LSN
	log = log.With("run", rep.RunID, "snapshot_lsn", snap.LSN.String())
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.String()
	}
	log.Info("backfill started", "trigger", job.Trigger, "tables", names, "workers", job.Workers, "chunk_rows", job.ChunkRows)
	began := time.Now()
	stopWarn := warnSnapshotAge(ctx, job.SnapshotWarn, log)
	defer stopWarn()

	src, err := pgsession.Connect(ctx, job.Source, "source")
	if err != nil {
		return rep, err
	}
	defer src.Close(context.WithoutCancel(ctx))
	runs := make([]*tableRun, len(tables))
	pending := make([][]chunkWork, len(tables))
	var total int64
	for i, t := range tables {
		tr, work, kept, err := startTable(ctx, ctrl, job, rep.RunID, snap.LSN, t)
		if err != nil {
			return rep, err
		}
		runs[i], pending[i] = tr, work
		rep.Kept += kept
		total += estimateRows(ctx, src, t)
	}
	job.Progress.Start(total, rep.Kept)
	defer job.Progress.Finish()

	work := make(chan chunkWork)
	g, gctx := errgroup.WithContext(ctx)
	var mu sync.Mutex
	g.Go(func() error {
		defer close(work)
		for i, tr := range runs {
			if err := planTable(gctx, ctrl, src, job, *snap, tr, pending[i], work); err != nil {
				return err
			}
		}
		return nil
	})
	for w := 0; w < job.Workers; w++ {
		g.Go(func() error {
			wk, err := newBackfillWorker(gctx, job, *snap)
			if err != nil {
				return err
			}
			defer wk.close()
			return wk.run(gctx, work, func(cw chunkWork, done chunkDone) error {
				mu.Lock()
				rep.Rows += done.rows
				rep.Result.Add(done.result)
				job.Metrics.backfillChunk(cw.tr.t.String(), done.rows, done.result)
				if done.reread {
					rep.Reread += done.rows
				}
				mu.Unlock()
				job.Progress.Add(done.rows)
				if job.AfterChunk != nil {
					cw.tr.mu.Lock()
					rows := cw.tr.rows
					cw.tr.mu.Unlock()
					job.AfterChunk(cw.tr.t.String(), rows)
				}
				n, err := wk.finishIfComplete(gctx, cw.tr, log)
				if n > 0 {
					mu.Lock()
					rep.Tombstoned += n
					mu.Unlock()
				}
				return err
			})
		})
	}
	if err := g.Wait(); err != nil {
		return rep, fmt.Errorf("backfill run %d: %w", rep.RunID, err)
	}
	// A table whose chunks had all completed in earlier runs is finished here.
	wk := &backfillWorker{tgt: ctrl, ap: apply.New(ctrl), snap: *snap}
	for _, tr := range runs {
		if n, err := wk.finishIfComplete(ctx, tr, log); err != nil {
			return rep, err
		} else if n >= 0 {
			rep.Tombstoned += n
		}
	}
	for _, tr := range runs {
		if tr.result != nil {
			rep.Tables = append(rep.Tables, *tr.result)
		}
	}
	secs := max(time.Since(began).Seconds(), 0.001)
	log.Info("backfill completed", "rows", rep.Rows, "rows_per_s", int64(float64(rep.Rows)/secs), "reread", rep.Reread,
		"kept_from_earlier_runs", rep.Kept, "applied", rep.Result.Applied, "suppressed", rep.Result.Suppressed,
		"tombstoned_absent", rep.Tombstoned, "seconds", fmt.Sprintf("%.1f", secs))
	return rep, nil
}

// sourceID returns cdc.SourceID of the database at url.
func sourceID(ctx context.Context, url string) (string, error) {
	conn, err := pgsession.Connect(ctx, url, "source")
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return cdc.SourceID(ctx, conn)
}

// lockTables takes the backfill lock of each table of job in ctrl's session and returns the
// tables it holds; a table another process holds is waited for, skipped (listed in rep.Skipped)
// or an error, as job.Busy says.
func lockTables(ctx context.Context, ctrl *pgx.Conn, job backfillJob, rep *backfillReport) ([]changebatch.Table, error) {
	var out []changebatch.Table
	for _, t := range job.Tables {
		ok, err := apply.LockBackfill(ctx, ctrl, t, false)
		if err != nil {
			return nil, err
		}
		if !ok {
			switch job.Busy {
			case busySkip:
				rep.Skipped = append(rep.Skipped, t.String())
				continue
			case busyWait:
				job.Logger.Info("waiting for another backfill of the table to end", "table", t.String())
				if _, err := apply.LockBackfill(ctx, ctrl, t, true); err != nil {
					return nil, err
				}
			default:
				return nil, fmt.Errorf("another backfill of %s is running (a `pgconverge backfill`, or a daemon's initial load or scheduled backfill): wait for it to end, or pass --wait", t)
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// warnSnapshotAge logs a warning every d while the run holds its snapshot; the returned function
// stops it.
func warnSnapshotAge(ctx context.Context, d time.Duration, log *slog.Logger) func() {
	if d <= 0 {
		return func() {}
	}
	began := time.Now()
	return every(ctx, d, func() {
		log.Warn("the backfill has held its snapshot for long: it holds back VACUUM on the source; more --workers or a smaller table list shorten it",
			"held_for", time.Since(began).Round(time.Second).String())
	})
}

// backfillBatchRows is the number of rows per change batch within a chunk: it bounds the memory a
// worker holds (with backfill.MaxBatchBytes).
const backfillBatchRows = 10_000

// addBackfillFlags defines the flags that size backfills, shared by run and backfill.
func addBackfillFlags(f *pflag.FlagSet, workers, chunkRows *int, snapshotWarn *time.Duration) {
	f.IntVar(workers, "workers", 2, "chunks read and applied in parallel during a backfill (each uses a source and a target connection)")
	f.IntVar(chunkRows, "chunk-rows", 250_000, "rows per chunk, the unit of parallel reading and of resuming; a chunk whose keys the target does not hold is copied in one transaction, else merged batch by batch")
	f.DurationVar(snapshotWarn, "snapshot-warn", 30*time.Minute, "warn when a backfill holds its snapshot longer than this (it holds back VACUUM on the source); 0 never warns")
}

// addSyncSequencesFlag defines --sync-sequences, shared by run and backfill.
func addSyncSequencesFlag(f *pflag.FlagSet, sync *bool) {
	f.BoolVar(sync, "sync-sequences", false, "after a table's backfill completes, sync the sequences it uses to the target as the sequences command does (a point-in-time value: run pgconverge sequences again at cutover)")
}

// validateBackfillSizes checks the values of the backfill flags.
func validateBackfillSizes(workers, chunkRows int, snapshotWarn time.Duration) error {
	var errs []error
	if snapshotWarn < 0 {
		errs = append(errs, errors.New("--snapshot-warn must not be negative (0 never warns)"))
	}
	if workers < 1 {
		errs = append(errs, errors.New("--workers must be at least 1"))
	}
	if chunkRows < 1 {
		errs = append(errs, errors.New("--chunk-rows must be positive"))
	}
	return errors.Join(errs...)
}
