package backfillrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/advisory"
	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/sequences"
	"golang.org/x/sync/errgroup"
)

// Job is one backfill run: every chunk of every table read from one exact snapshot by
// Workers readers in parallel, each chunk applied through the apply step in one target
// transaction together with its ledger row. The daemon's initial load, `pgconverge backfill` and
// scheduled backfills are all such runs. The target tables must exist (apply.EnsureTable).
type Job struct {
	Source, Target string
	// Primary is the URL of Source's primary when Source is a hot standby (pgconverge run --primary).
	Primary string
	Tables  []changebatch.Table
	// Trigger is coverage.TriggerInitial, TriggerManual, TriggerSchedule or TriggerGap.
	Trigger string
	// Slot names the slot whose stream follows the tables; "" when none does.
	Slot string
	// LeaderSlot and Epoch, set in a daemon's runs, are the slot the daemon leads and its leader
	// epoch: every chunk transaction checks them (apply.CheckLeaderTx), so a daemon that lost its
	// leadership commits no chunk after a new leader took over.
	LeaderSlot string
	Epoch      int64
	// Publication is the publication the tables are read through (a daemon's); "" when they are
	// read as the ledger records. Workers that join the run (Join) read them the same way.
	Publication string
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
	Busy Busy
	// SnapshotWarn is how long the run may hold its snapshot before it warns (it holds back VACUUM
	// on the source); 0 never warns.
	SnapshotWarn time.Duration
	Logger       *slog.Logger
	Progress     Progress
	// AfterChunk is a test hook run after each committed chunk with the table and rows so far;
	// AfterMergedBatch after each committed batch of a merged chunk.
	AfterChunk       func(table string, rows int64)
	AfterMergedBatch func()
	// BeforeFenced is Knobs.BeforeFenced of a daemon's runs.
	BeforeFenced func(change string)
	// Monitor counts the rows read and applied.
	Monitor Monitor
	// Lease is the lease's timings of the run's sessions and of its watch of other processes'
	// (lease.Timings); unset ones are the production ones. Tests set shorter ones.
	Lease lease.Timings
	// CopyOnly is the set of tables staged by COPY only that the run's Appliers share (a daemon's,
	// Config.copyOnly); nil: Run makes one for the run.
	CopyOnly *apply.CopyOnlyTables
	// SourceID identifies the source database (cdc.SourceID); Run reads it.
	SourceID string
	// ChunkTimeCap, when above 0, bounds how long one read of the source should take: a chunk
	// read that took longer has the table's further reads split (timecap.go), each a statement
	// of at most half the rows of the one that passed the cap. 0 reads each chunk in one
	// statement.
	ChunkTimeCap time.Duration
	// Pacer paces the run's reads of the source (pacing.Pacer): every worker waits while it is
	// held before it starts a chunk, and takes the rows and bytes it reads from its rate limits.
	// nil reads as fast as the workers go.
	Pacer *pacing.Pacer
	// conflicts counts the conflicts the run's transactions lost and retried; Run sets it.
	conflicts *atomic.Int64
	// lease holds the process's target sessions of the run alive (lease.Worker); Run and
	// Join set it.
	lease *lease.Worker
}

// Busy is what a backfill does with a table another backfill holds.
type Busy int

const (
	BusyFail Busy = iota
	BusyWait
	BusySkip
)

// Report sums up a run.
type Report struct {
	RunID    int64
	Snapshot pglogrepl.LSN
	// Rows were read from the source in this run; Reread of them are in chunks an interrupted
	// run had started; Kept rows were applied by interrupted runs and kept.
	Rows, Reread, Kept int64
	// Joined counts the rows of chunks workers of other processes applied (Join).
	Joined int64
	// Conflicts counts the transactions of the run that lost a deadlock or a serialization
	// conflict with a concurrent writer and were retried.
	Conflicts int64
	Result    apply.Result
	// Tombstoned counts live target rows the source no longer had, turned into tombstones.
	Tombstoned int64
	// Tables lists the tables backfilled, each at the smallest S of its chunks.
	Tables  []TableResult
	Skipped []string
	// Sequences are the outcomes of --sync-sequences after the run, nil without it.
	Sequences []sequences.Line
}

// TableResult is one table of a completed run.
type TableResult struct {
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
	result *TableResult
	// unwritten is true when, as the run took the table's backfill lock, its target table was empty
	// and no stream wrote it (coverage.Unwritten): every row it holds at the end came from this run.
	unwritten bool
	// keyDeferred is true when this run dropped the table's primary key for a bulk load
	// (apply.DeferKey); completing the table builds it.
	keyDeferred bool
	// byBlock is true when the table's plan is cut by block ranges (backfill.NewBlockPlanner).
	byBlock bool
	// held lists the chunks a worker of another process (Join) held when this run's worker came to
	// them: awaitHeld waits for them.
	held []chunkWork
	// readLimit is the most rows one read of the table's chunks takes once a read passed the
	// time cap (Job.ChunkTimeCap), 0 while none did.
	readLimit int
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

// Run runs job and returns its report. On an error the run is recorded as failed, on a
// cancelled ctx as interrupted; either way what it completed stays for the next run to resume.
func Run(ctx context.Context, job Job) (rep Report, err error) {
	if job.Monitor == nil {
		job.Monitor = nopMonitor{}
	}
	job.conflicts = new(atomic.Int64)
	if job.CopyOnly == nil {
		job.CopyOnly = new(apply.CopyOnlyTables)
	}
	defer func() { rep.Conflicts = job.conflicts.Load() }()
	ctrl, err := pgsession.Connect(ctx, job.Target, "target")
	if err != nil {
		return rep, err
	}
	defer ctrl.Close(context.WithoutCancel(ctx))
	defer func() {
		// Release the backfill locks now: a closed session's locks outlive it until its backend
		// exits, which a next backfill of the same tables must not have to wait for.
		ctrl.Exec(context.WithoutCancel(ctx), `select `+advisory.UnlockAll)
	}()
	if job.SourceID, err = sourceID(ctx, job.Source); err != nil {
		return rep, err
	}
	tables, err := lockTables(ctx, ctrl, job, &rep)
	if err != nil || len(tables) == 0 {
		return rep, err
	}
	if rep.RunID, err = coverage.StartRun(ctx, ctrl, job.Trigger, job.Slot, job.Workers, job.ChunkRows); err != nil {
		return rep, err
	}
	log := job.Logger
	defer func() { err = endRun(ctx, ctrl, job.Target, log, rep, err) }()
	// The run stops when its lease lapsed (lost): other processes may have ended its sessions.
	leased, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	if job.lease, err = lease.StartWorker(leased, job.Target, rep.RunID, false, job.Lease, log.With("run", rep.RunID), lost); err != nil {
		return rep, err
	}
	defer job.lease.End(ctx, ctrl, log)
	if err := job.lease.Add(ctx, ctrl); err != nil {
		return rep, err
	}
	snap := job.Snapshot
	if snap == nil {
		exp, err := backfill.Export(leased, job.Source, job.Primary, pgsession.LogSlotWait(log))
		if err != nil {
			return rep, err
		}
		defer exp.Close(context.WithoutCancel(ctx)) // drops the temporary slot
		snap = &exp.Snapshot
	}
	rep.Snapshot = snap.LSN
	log = log.With("run", rep.RunID, "snapshot_lsn", snap.LSN.String())
	err = runTables(leased, ctrl, job, *snap, tables, &rep, log)
	if cause := context.Cause(leased); err != nil && ctx.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	} else if pgsession.IsCode(err, pgerrcode.AdminShutdown) {
		err = fmt.Errorf("%w (a target session of this run was ended: %s; the next run of its tables resumes it)", err, endedBy)
	}
	return rep, err
}

// endRun records the end of run rep.RunID as runErr says (completed, failed or interrupted) and
// returns runErr, or the error of recording the end when runErr is nil. A run stopped by a rewrite
// of a source table is abandoned: chunks read before a rewrite or TRUNCATE may hold rows the table
// no longer has, so the next run starts the table over instead of resuming.
func endRun(ctx context.Context, ctrl *pgx.Conn, target string, log *slog.Logger, rep Report, runErr error) error {
	// A cancellation during a query closes the connection (pgx); record the end over a new one.
	conn, ectx := ctrl, context.WithoutCancel(ctx)
	if conn.IsClosed() {
		c, err := pgsession.Connect(ectx, target, "target")
		if err != nil {
			log.Error("record the end of the backfill run", "run", rep.RunID, "err", err)
			return runErr
		}
		defer c.Close(ectx)
		conn = c
	}
	if err := coverage.EndRun(ectx, conn, rep.RunID, rep.Rows, rep.Reread, runErr); err != nil {
		if runErr == nil {
			return err
		}
		log.Error("record the end of the backfill run", "run", rep.RunID, "err", err)
	}
	if errors.Is(runErr, backfill.ErrRewritten) {
		if err := coverage.AbandonRun(ectx, conn, rep.RunID); err != nil {
			log.Error("abandon the backfills of a run stopped by a rewrite", "run", rep.RunID, "err", err)
		}
	}
	return runErr
}

// runTables backfills the locked tables of run rep.RunID from snap: it starts (or adopts) each
// table's backfill, reads and applies their chunks (runChunks), finishes the tables whose chunks
// all completed, and fills in rep. It logs on log, which names the run and its snapshot.
func runTables(ctx context.Context, ctrl *pgx.Conn, job Job, snap backfill.Snapshot, tables []changebatch.Table, rep *Report, log *slog.Logger) error {
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
		return err
	}
	defer src.Close(context.WithoutCancel(ctx))
	runs := make([]*tableRun, len(tables))
	pending := make([][]chunkWork, len(tables))
	var total int64
	// A daemon's run starts the tables (deferring, restoring keys, emptying an interrupted bulk
	// load) only while ctrl holds its epoch (fence.go).
	release, err := holdEpoch(ctx, ctrl, job.LeaderSlot, job.Epoch)
	if err != nil {
		return err
	}
	for i, t := range tables {
		tr, work, kept, err := startTable(ctx, ctrl, src, job, rep.RunID, snap.LSN, t)
		if err != nil {
			release()
			return err
		}
		runs[i], pending[i] = tr, work
		rep.Kept += kept
		total += estimateRows(ctx, src, t)
	}
	release()
	if snap.Name != "" {
		// From here on every chunk recorded for the run may be read by any worker, this process's
		// or one that joins the run.
		if err := coverage.PublishRun(ctx, ctrl, rep.RunID, snap.Name, snap.LSN, job.Publication, job.LeaderSlot, job.Epoch); err != nil {
			return err
		}
		stopWatch, err := lease.WatchWorkers(ctx, job.Target, job.Lease, log)
		if err != nil {
			return err
		}
		defer stopWatch()
	}
	job.Progress.Start(total, rep.Kept)
	defer job.Progress.Finish()
	if err := runChunks(ctx, ctrl, src, job, snap, runs, pending, rep, log); err != nil {
		return fmt.Errorf("backfill run %d: %w", rep.RunID, err)
	}
	if err := awaitHeld(ctx, job, snap, runs, rep, log); err != nil {
		return fmt.Errorf("backfill run %d: %w", rep.RunID, err)
	}
	// A table whose chunks had all completed in earlier runs is finished here.
	wk := &backfillWorker{tgt: ctrl, ap: apply.New(ctrl, job.CopyOnly), snap: snap, log: log, mon: job.Monitor, conflicts: job.conflicts,
		slot: job.LeaderSlot, epoch: job.Epoch}
	for _, tr := range runs {
		if n, err := wk.finishIfComplete(ctx, tr, log); err != nil {
			return err
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
	log.Info("backfill completed", "rows", rep.Rows, "rows_per_s", int64(float64(rep.Rows+rep.Joined)/secs), "reread", rep.Reread,
		"kept_from_earlier_runs", rep.Kept, "rows_by_joined_workers", rep.Joined, "applied", rep.Result.Applied, "suppressed", rep.Result.Suppressed,
		"tombstoned_absent", rep.Tombstoned, "seconds", fmt.Sprintf("%.1f", secs))
	return nil
}

// runChunks reads and applies the chunks of the tables under one errgroup: a planner hands each
// table's adopted chunks, then its newly planned ones, to job.Workers workers, which count each
// completed chunk in rep (tally) and finish a table when its last chunk completed. The planner
// records up to chunkLookahead chunks ahead of the workers, for workers of other processes that
// joined the run to claim.
func runChunks(ctx context.Context, ctrl, src *pgx.Conn, job Job, snap backfill.Snapshot, runs []*tableRun, pending [][]chunkWork, rep *Report, log *slog.Logger) error {
	work := make(chan chunkWork, chunkLookahead)
	g, gctx := errgroup.WithContext(ctx)
	var mu sync.Mutex
	g.Go(func() error {
		defer close(work)
		for i, tr := range runs {
			if err := planTable(gctx, ctrl, src, job, snap, tr, pending[i], work); err != nil {
				return err
			}
		}
		return nil
	})
	for w := 0; w < job.Workers; w++ {
		g.Go(func() error {
			wk, err := newBackfillWorker(gctx, job, snap)
			if err != nil {
				return err
			}
			defer wk.close()
			return wk.run(gctx, work, func(cw chunkWork, done chunkDone) error {
				return tally(gctx, wk, &mu, job, cw, done, rep, log)
			})
		})
	}
	return g.Wait()
}

// chunkLookahead is how many planned chunks the planner records ahead of the run's own workers.
const chunkLookahead = 256

// tally counts chunk cw, completed as done says, in rep under mu, reports it to job's monitor,
// progress and AfterChunk hook, and has wk finish cw's table when it was the table's last chunk.
func tally(ctx context.Context, wk *backfillWorker, mu *sync.Mutex, job Job, cw chunkWork, done chunkDone, rep *Report, log *slog.Logger) error {
	mu.Lock()
	rep.Rows += done.rows
	rep.Joined += done.byOther
	rep.Result.Add(done.result)
	job.Monitor.BackfillChunk(cw.tr.t.String(), done.rows, done.result.Counts())
	if done.reread {
		rep.Reread += done.rows
	}
	mu.Unlock()
	job.Progress.Add(done.rows + done.byOther)
	if job.AfterChunk != nil {
		cw.tr.mu.Lock()
		rows := cw.tr.rows
		cw.tr.mu.Unlock()
		job.AfterChunk(cw.tr.t.String(), rows)
	}
	n, err := wk.finishIfComplete(ctx, cw.tr, log)
	if n > 0 {
		mu.Lock()
		rep.Tombstoned += n
		mu.Unlock()
	}
	return err
}

// awaitHeld waits until every chunk that workers of other processes held (tableRun.held) is
// completed, polling the ledger, and applies itself each one whose worker ended first (its claim
// lapsed with its session); tables complete as their last chunk does.
func awaitHeld(ctx context.Context, job Job, snap backfill.Snapshot, runs []*tableRun, rep *Report, log *slog.Logger) error {
	var held []chunkWork
	for _, tr := range runs {
		held = append(held, tr.held...)
		tr.held = nil
	}
	if len(held) == 0 {
		return nil
	}
	log.Info("waiting for the chunks workers of joined processes are applying", "chunks", len(held))
	wk, err := newBackfillWorker(ctx, job, snap)
	if err != nil {
		return err
	}
	defer wk.close()
	var mu sync.Mutex
	tick := time.NewTicker(heldPoll)
	defer tick.Stop()
	for {
		var still []chunkWork
		for _, cw := range held {
			done, err := wk.chunk(ctx, cw)
			if err != nil {
				return err
			}
			if done.held {
				still = append(still, cw)
			} else if err := tally(ctx, wk, &mu, job, cw, done, rep, log); err != nil {
				return err
			}
		}
		if held = still; len(held) == 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// heldPoll is how often awaitHeld looks at the chunks other processes hold.
const heldPoll = 250 * time.Millisecond

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
func lockTables(ctx context.Context, ctrl *pgx.Conn, job Job, rep *Report) ([]changebatch.Table, error) {
	var out []changebatch.Table
	for _, t := range job.Tables {
		ok, err := coverage.LockBackfill(ctx, ctrl, t.TableName, false)
		if err != nil {
			return nil, err
		}
		if !ok {
			switch job.Busy {
			case BusySkip:
				rep.Skipped = append(rep.Skipped, t.String())
				continue
			case BusyWait:
				job.Logger.Info("waiting for another backfill of the table to end", "table", t.String())
				if _, err := coverage.LockBackfill(ctx, ctrl, t.TableName, true); err != nil {
					return nil, err
				}
			default:
				if ok, err = lockWithinGrace(ctx, ctrl, t.TableName); err != nil {
					return nil, err
				} else if ok {
					break
				}
				return nil, fmt.Errorf("another backfill of %s is running (a `pgconverge backfill`, or a daemon's initial load or scheduled backfill): wait for it to end, or pass --wait", t)
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// busyGrace is how long a backfill that may not wait tries a table's busy backfill lock before it
// refuses: the tombstone pruner holds the lock for one transaction (coverage.TombstoneHorizon), a
// backfill for its whole run.
const busyGrace = 5 * time.Second

// lockWithinGrace tries table t's backfill lock in ctrl's session every 100 ms for busyGrace and
// reports whether it took it.
func lockWithinGrace(ctx context.Context, ctrl *pgx.Conn, t changebatch.TableName) (bool, error) {
	for deadline := time.Now().Add(busyGrace); time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if ok, err := coverage.LockBackfill(ctx, ctrl, t, false); err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// warnSnapshotAge logs a warning every d while the run holds its snapshot; the returned function
// stops it.
func warnSnapshotAge(ctx context.Context, d time.Duration, log *slog.Logger) func() {
	if d <= 0 {
		return func() {}
	}
	began := time.Now()
	return lease.Every(ctx, d, func(context.Context) {
		log.Warn("the backfill has held its snapshot for long: it holds back VACUUM on the source; more --workers or a smaller table list shorten it",
			"held_for", time.Since(began).Round(time.Second).String())
	})
}

// BatchRows is the number of rows per change batch within a chunk: it bounds the memory a
// worker holds (with backfill.MaxBatchBytes).
const BatchRows = 10_000

// ValidateSizes reports the problems of the values that size backfills, naming the flag to fix;
// nil when there are none.
func ValidateSizes(workers, chunkRows int, snapshotWarn time.Duration) error {
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

// Completed returns the names of those of tables whose backfill the run completed, in tables'
// order.
func (rep Report) Completed(tables []changebatch.Table) []changebatch.TableName {
	done := map[string]bool{}
	for _, r := range rep.Tables {
		done[r.Table] = true
	}
	var out []changebatch.TableName
	for _, t := range tables {
		if done[t.String()] {
			out = append(out, t.TableName)
		}
	}
	return out
}
