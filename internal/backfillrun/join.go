package backfillrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/migrations"
	"golang.org/x/sync/errgroup"
)

// JoinConfig configures Join (`pgconverge backfill --join`).
type JoinConfig struct {
	Source, Target string
	// Run is the id of the run to join; 0 joins the newest running one.
	Run int64
	// Workers chunks are read and applied at once.
	Workers int
	// Wait waits for a run to join to start, instead of failing when none runs.
	Wait   bool
	Logger *slog.Logger
	// Progress reports rows; nil reports nothing.
	Progress Progress
	// Lease is the lease's timings of the process's sessions (lease.Timings); unset ones are the
	// production ones. Tests set shorter ones, the same as the run's.
	Lease lease.Timings
	// Pacer paces this process's reads (Job.Pacer); nil reads as fast as the workers go.
	Pacer *pacing.Pacer
}

// Validate reports every problem of the configuration at once.
func (c *JoinConfig) Validate() error {
	errs := pgsession.ValidateURLs(c.Source, c.Target)
	if c.Workers < 1 {
		errs = append(errs, errors.New("--workers must be at least 1"))
	}
	if c.Run < 0 {
		errs = append(errs, errors.New("--run must be a backfill run id (see pgconverge status) or 0 for the newest"))
	}
	return errors.Join(errs...)
}

// JoinReport sums up what a joined process did.
type JoinReport struct {
	RunID int64
	// Chunks and Rows count the chunks this process applied and their rows.
	Chunks int
	Rows   int64
	Result apply.Result
	// Ended says why the process stopped: the run completed, or ended another way; Completed is
	// true when the run completed.
	Ended     string
	Completed bool
}

// Join is `pgconverge backfill --join`: it adds Workers workers, in this process, to a backfill
// run another process runs (a `pgconverge backfill`, or a daemon's initial load or scheduled
// backfill) on the same source and target, typically from another host. Each worker claims the
// run's recorded chunks in the ledger (coverage.ClaimAnyChunk, FOR UPDATE SKIP LOCKED) and reads
// each at the run's own exact snapshot (imported by its id), applying it through the apply step
// like the run's own workers; the run's process completes the tables. Join returns when the run
// ends, when ctx ends, or on an error; a chunk it held when it stopped is claimable again at once
// (its claim lapses with its session), so stopping it, even with SIGKILL, costs no data.
func Join(ctx context.Context, cfg JoinConfig) (JoinReport, error) {
	if cfg.Progress == nil {
		cfg.Progress = NopProgress{}
	}
	var rep JoinReport
	src, tgt, err := pgsession.ConnectBoth(ctx, cfg.Source, cfg.Target)
	if err != nil {
		return rep, err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), src, tgt)
	if err := pgsession.CheckDistinct(ctx, src, tgt); err != nil {
		return rep, err
	}
	if err := migrations.Apply(ctx, tgt); err != nil {
		return rep, err
	}
	run, err := findRun(ctx, tgt, cfg)
	if err != nil || run == nil {
		return rep, err
	}
	rep.RunID = run.ID
	if err := checkRunSource(ctx, src, tgt, run.ID); err != nil {
		return rep, err
	}
	log := cfg.Logger.With("run", run.ID, "snapshot_lsn", run.LSN.String())
	log.Info("joined the backfill run", "trigger", run.Trigger, "workers", cfg.Workers)
	j := &joiner{cfg: cfg, run: run, log: log, tables: map[int64]*tableRun{}, copyOnly: new(apply.CopyOnlyTables)}
	jctx, lose := context.WithCancelCause(ctx)
	defer lose(nil)
	if j.lease, err = lease.StartWorker(jctx, cfg.Target, run.ID, true, cfg.Lease, log, lose); err != nil {
		return rep, err
	}
	defer j.lease.End(ctx, tgt, log)
	cfg.Progress.Start(0, 0)
	defer cfg.Progress.Finish()
	g, gctx := errgroup.WithContext(jctx)
	for w := 0; w < cfg.Workers; w++ {
		g.Go(func() error { return j.work(gctx) })
	}
	err = g.Wait()
	if cause := context.Cause(jctx); ctx.Err() == nil && cause != nil {
		err = cause
	}
	rep.Chunks, rep.Rows, rep.Result, rep.Ended, rep.Completed = j.chunks, j.rows, j.result, j.ended, j.completed
	if err == nil {
		log.Info("left the backfill run", "why", rep.Ended, "chunks", rep.Chunks, "rows", rep.Rows)
	}
	return rep, err
}

// findRun returns the run cfg names, or the newest running one; with cfg.Wait it waits for one
// to start. It returns nil only when ctx ended while waiting.
func findRun(ctx context.Context, tgt *pgx.Conn, cfg JoinConfig) (*coverage.SharedRun, error) {
	logged := false
	for {
		run, err := coverage.JoinableRun(ctx, tgt, cfg.Run)
		if err != nil || run != nil {
			return run, err
		}
		switch {
		case !cfg.Wait && cfg.Run != 0:
			return nil, fmt.Errorf("backfill run %d is not running on the target (or has not taken its snapshot yet): see pgconverge status; --wait waits for it", cfg.Run)
		case !cfg.Wait:
			return nil, errors.New("no backfill run is running on the target: start one (pgconverge backfill, or pgconverge run's initial load or --backfill-schedule), or pass --wait to wait for one")
		case !logged:
			cfg.Logger.Info("waiting for a backfill run to join")
			logged = true
		}
		select {
		case <-time.After(heldPoll):
		case <-ctx.Done():
			return nil, nil
		}
	}
}

// checkRunSource refuses to join run id from another source database than the run reads.
func checkRunSource(ctx context.Context, src, tgt *pgx.Conn, id int64) error {
	want, err := coverage.RunSource(ctx, tgt, id)
	if err != nil || want == "" {
		return err
	}
	have, err := cdc.SourceID(ctx, src)
	if err != nil {
		return err
	}
	if have != want {
		return fmt.Errorf("backfill run %d reads source database %s, but --source is %s: pass the run's source", id, want, have)
	}
	return nil
}

// joiner is the state the workers of one Join share.
type joiner struct {
	cfg JoinConfig
	run *coverage.SharedRun
	log *slog.Logger
	mu  sync.Mutex
	// tables holds each table backfill's state by its id, described on first use.
	tables map[int64]*tableRun
	chunks int
	rows   int64
	result apply.Result
	ended  string
	// completed is true when the run ended completed.
	completed bool
	// lease holds the workers' target sessions alive (lease.Worker).
	lease *lease.Worker
	// copyOnly is the set of tables staged by COPY only that the workers' Appliers share.
	copyOnly *apply.CopyOnlyTables
}

// work is one worker: it claims and applies chunks of the run until the run ends.
func (j *joiner) work(ctx context.Context) error {
	run := j.run
	job := Job{Source: j.cfg.Source, Target: j.cfg.Target, BatchRows: BatchRows, ChunkRows: int(run.ChunkRows), Logger: j.log,
		CopyOnly: j.copyOnly, Pacer: j.cfg.Pacer}
	job.LeaderSlot, job.Epoch, job.lease = run.LeaderSlot, run.Epoch, j.lease
	w, err := newBackfillWorker(ctx, job, backfill.Snapshot{Name: run.Snapshot, LSN: run.LSN})
	if err != nil {
		return err
	}
	defer w.close()
	w.runID = run.ID
	for {
		c, err := coverage.ClaimAnyChunk(ctx, w.tgt, run.ID)
		if err != nil {
			return explainEnded(w, err)
		}
		if c == nil {
			if done, err := j.runEnded(ctx, w.tgt); done || err != nil {
				return err
			}
			select {
			case <-time.After(heldPoll):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		var done chunkDone
		tr, err := j.table(ctx, w, c)
		if err == nil {
			cw := chunkWork{tr: tr, ordinal: c.Ordinal, doneKey: c.DoneKey,
				chunk: backfill.Chunk{Lower: c.Lower, Upper: c.Upper, ByBlock: slices.Equal(c.KeyColumns, backfill.BlockPlanColumns())}}
			done, err = w.applyChunk(ctx, cw, c.Before)
		}
		if err != nil {
			return j.chunkFailed(ctx, w, c, err)
		}
		j.mu.Lock()
		j.chunks++
		j.rows += done.rows
		j.result.Add(done.result)
		j.mu.Unlock()
		j.cfg.Progress.Add(done.rows)
	}
}

// chunkFailed returns what ends worker w after applying its claimed chunk c failed with err: nil
// when the run ended meanwhile (its process completed, failed or was killed, a later run adopted
// the table: a lapsed ownership or snapshot, or, for a daemon's run, another daemon took over its
// slot: an *apply.FencedError), which ends this process's part, else err,
// explained when w's target session was ended (explainEnded).
func (j *joiner) chunkFailed(ctx context.Context, w *backfillWorker, c *coverage.ClaimedChunk, err error) error {
	var fenced *apply.FencedError
	if errors.As(err, &fenced) {
		why := fmt.Sprintf("the daemon that runs it lost the leadership of slot %q to %s (epoch %d after the run's %d): it writes nothing more, and the new leader resumes the run's tables",
			fenced.Slot, fenced.Holder, fenced.Current, fenced.Epoch)
		j.log.Info("the backfill run ended while a chunk was being applied: "+why, "table", c.Table.String(), "chunk", c.Ordinal)
		j.mu.Lock()
		j.ended = why
		j.mu.Unlock()
		return nil
	}
	if sessionEnded(w, err) {
		err = explainEnded(w, err)
	} else if ended, rerr := j.runEnded(context.WithoutCancel(ctx), w.tgt); errors.Is(err, coverage.ErrRunEnded) || (ended && rerr == nil) {
		j.log.Info("the backfill run ended while a chunk was being applied; the chunk is left to the run that resumes it",
			"table", c.Table.String(), "chunk", c.Ordinal, "err", err)
		return nil
	}
	return fmt.Errorf("chunk %d of %s: %w", c.Ordinal, c.Table, err)
}

// sessionEnded reports whether err, from worker w, comes of w's target session having been ended.
func sessionEnded(w *backfillWorker, err error) bool {
	return pgsession.IsCode(err, pgerrcode.AdminShutdown) || w.tgt.IsClosed()
}

// explainEnded returns err, from worker w, saying why when w's target session was ended
// (sessionEnded): see endedBy.
func explainEnded(w *backfillWorker, err error) error {
	if !sessionEnded(w, err) {
		return err
	}
	return fmt.Errorf("%w (this worker's target session was ended: %s)", err, endedBy)
}

// endedBy says who ends a backfill process's target sessions.
var endedBy = fmt.Sprintf("other pgconverge processes end a backfill process's sessions when it was silent past the %s lease (was this process stopped, or its host cut off?), or when it held off a new leader's takeover past it; else the target shut down, or an operator ended it", lease.Term)

// runEnded reports whether the run no longer runs, and records how it ended.
func (j *joiner) runEnded(ctx context.Context, tgt *pgx.Conn) (bool, error) {
	status, running, err := coverage.RunState(ctx, tgt, j.run.ID)
	if err != nil || running {
		return false, err
	}
	why := "the run " + status + " (see pgconverge status)"
	switch status {
	case "completed":
		why = "the run completed"
	case "running":
		why = "the run's process ended without recording the end (it was killed, lost its target connection, or froze and had its sessions ended after the lease): the next run of its tables resumes it"
	}
	j.mu.Lock()
	if j.ended == "" { // a takeover that fenced a chunk (chunkFailed) says more than its run's end
		j.ended, j.completed = why, status == "completed"
	}
	j.mu.Unlock()
	return true, nil
}

// table returns the state of the table backfill of claimed chunk c, describing its table on the
// source first as the run reads it (through the run's publication, or as the ledger records), and
// refuses a table whose description reads other rows or columns than the run's.
func (j *joiner) table(ctx context.Context, w *backfillWorker, c *coverage.ClaimedChunk) (*tableRun, error) {
	j.mu.Lock()
	tr := j.tables[c.Backfill]
	j.mu.Unlock()
	if tr != nil {
		return tr, nil
	}
	t, err := cdc.DescribeTable(ctx, w.src, c.Table.Schema, c.Table.Name)
	if err == nil && j.run.Publication != "" {
		err = cdc.ReadPublicationShape(ctx, w.src, j.run.Publication, &t)
	} else if err == nil {
		err = ReadLedgerPublicationShape(ctx, w.src, w.tgt, &t)
	}
	if err != nil {
		return nil, err
	}
	if t.Shape() != c.Shape {
		return nil, fmt.Errorf("backfill run %d reads %s as %q, but this process describes it as %q: the table or its publication changed since the run started",
			j.run.ID, t, c.Shape, t.Shape())
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if tr = j.tables[c.Backfill]; tr == nil {
		tr = &tableRun{t: t, id: c.Backfill}
		j.tables[c.Backfill] = tr
	}
	return tr, nil
}
