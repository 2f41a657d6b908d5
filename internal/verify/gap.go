package verify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/reconcile"
)

// GapJob is one table's gap repair by comparison (RepairGap): a daemon's alternative to a gap
// backfill (run --on-gap=repair).
type GapJob struct {
	Source, Target string
	Table          changebatch.Table
	// Snapshot is the exact snapshot S to compare and read at: a new slot's own, or another whose
	// LSN the slot's stream continues from or before (the caller keeps it importable).
	Snapshot backfill.Snapshot
	// RunID is the gap-repair run (coverage.StartRun with coverage.TriggerGapRepair) the table's
	// repair is recorded in; Slot and Epoch the slot the daemon leads and its leader epoch, which
	// every write transaction checks (apply.CheckLeaderTx); SourceID the source database
	// (cdc.SourceID).
	RunID    int64
	Slot     string
	Epoch    int64
	SourceID string
	// CopyOnly is the daemon's set of tables staged by COPY only (apply.CopyOnlyTables).
	CopyOnly *apply.CopyOnlyTables
	// BeforeBatch, a test hook, runs before each write transaction (before its keys are read at
	// the snapshot) with the rows the repair wrote so far.
	BeforeBatch func(table string, written int64)
}

// GapResult is what one table's RepairGap did.
type GapResult struct {
	// Compared counts the source rows compared at S (the snapshot's rows but those of keys the
	// target holds a newer version of), Moved the target rows newer than S, left alone.
	Compared, Moved int64
	// Differing counts the keys found to differ; Written the target rows written for them (rows
	// and tombstones, as apply.Result.Applied counts them), Tombstones those of Written that are
	// tombstones (keys the source does not have at S).
	Differing, Written, Tombstones int64
	Elapsed                        time.Duration
}

// ErrNotComparable is wrapped by RepairGap's error when the table cannot be repaired by
// comparison, or should not be, and is to be backfilled instead; the error says why.
var ErrNotComparable = errors.New("cannot repair by comparison")

// Past GapRepairMaxShare of a table's estimated rows (pg_class.reltuples), and at least
// GapRepairMinKeys keys, a gap repair that finds more keys differing stops with ErrNotComparable:
// a backfill is then cheaper. Measured on 2,000,000 rows (scripts/bench-gaprepair.sh): with 1% of
// them changed the repair took 0.38–0.47× a backfill's time; with 25%, repaired to the end, 2.1×
// (the comparison, about 15 s, plus about 130 µs per differing key: a backfill costs about as
// much as 10% of the keys differing).
const (
	GapRepairMaxShare = 0.05
	GapRepairMinKeys  = 10000
)

// RepairGap repairs a table whose coverage has a gap by comparison: it compares the source at
// job.Snapshot S with the target as verify does (package reconcile; target rows newer than S are
// left alone), and writes only the keys that differ, a batch of at most RepairBatchRows per
// target transaction, through the apply step at version (S, 0): the source's row at S, or a
// tombstone where S has none. Equal rows are not written. Then, in one transaction, it raises the
// table's fence to (S, 0) and records the table repaired at S (coverage.RecordGapRepair): the
// target holds the source's state at S, as after a gap backfill, and the stream continues from S
// or before, so the gap is closed. A table without a key, a partitioned table, or one whose
// target table lacks a source column fails with ErrNotComparable before anything is written, and
// so does, part-way, one with more keys differing than GapRepairMaxShare allows. A
// repair that stops half-way leaves rows at (S, 0), which the next comparison finds equal or
// newer. The caller holds the table's backfill lock and no stream writes the table meanwhile.
func RepairGap(ctx context.Context, job GapJob) (GapResult, error) {
	began := time.Now()
	var res GapResult
	t := job.Table
	switch {
	case t.Keyless:
		return res, fmt.Errorf("%w: %s has no key (rows are compared by value, and a backfill rewrites them as copies)", ErrNotComparable, t)
	case t.Partitioned:
		return res, fmt.Errorf("%w: %s is a partitioned table", ErrNotComparable, t)
	}
	src, tgt, err := pgsession.ConnectBoth(ctx, job.Source, job.Target)
	if err != nil {
		return res, err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), src, tgt)
	keySrc, writer, err := pgsession.ConnectBoth(ctx, job.Source, job.Target)
	if err != nil {
		return res, err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), keySrc, writer)
	missing, err := missingColumns(ctx, tgt, t)
	if err != nil {
		return res, err
	}
	if len(missing) > 0 {
		return res, fmt.Errorf("%w: target table %s lacks source columns %q", ErrNotComparable, t, missing)
	}
	mode, err := reconcile.Probe(ctx, src, tgt)
	if err != nil {
		return res, err
	}
	stx, err := backfill.BeginSnapshot(ctx, src, job.Snapshot, t)
	if err != nil {
		return res, fmt.Errorf("read %s at snapshot %s: %w", t, job.Snapshot.LSN, err)
	}
	defer stx.Rollback(context.WithoutCancel(ctx))
	ttx, err := tgt.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return res, fmt.Errorf("begin the target's transaction: %w", err)
	}
	defer ttx.Rollback(context.WithoutCancel(ctx))
	var estimate float64
	if err := src.QueryRow(ctx, `select greatest(reltuples, 0) from pg_class where oid = $1::regclass`, t.Quoted()).Scan(&estimate); err != nil {
		return res, fmt.Errorf("read the estimated rows of %s: %w", t, err)
	}
	g := &gapWriter{job: job, src: keySrc, applier: apply.New(writer, job.CopyOnly), res: &res,
		limit: max(GapRepairMinKeys, int64(estimate*GapRepairMaxShare))}
	st, err := reconcile.Compare(ctx, stx, ttx, reconcile.Config{Table: t, Snapshot: job.Snapshot.LSN, Mode: mode, MaxDiffs: g.limit,
		Emit: func(ctx context.Context, diffs []reconcile.Diff) error {
			// Written while the comparison goes on: its target snapshot predates every write,
			// and each key is compared once.
			for from := 0; from < len(diffs); from += RepairBatchRows {
				part := diffs[from:min(len(diffs), from+RepairBatchRows)]
				if err := g.write(ctx, part); err != nil {
					return err
				}
			}
			return nil
		}})
	res.Compared, res.Moved = st.Compared, st.Moved
	if errors.Is(err, reconcile.ErrTooManyDiffs) {
		return res, fmt.Errorf("%w: %w (at most %.0f%% of its estimated rows, or %d keys, are repaired): a backfill is cheaper",
			ErrNotComparable, err, 100*GapRepairMaxShare, GapRepairMinKeys)
	}
	if err != nil {
		return res, err
	}
	if err := g.finish(ctx); err != nil {
		return res, err
	}
	res.Elapsed = time.Since(began)
	return res, nil
}

// gapWriter writes the differing keys of one RepairGap and records its end.
type gapWriter struct {
	job     GapJob
	src     *pgx.Conn // reads the keys at the snapshot
	applier *apply.Applier
	res     *GapResult
	limit   int64 // the most keys it writes (GapRepairMaxShare)
}

// begin begins a target transaction that writes as the slot's leader.
func (g *gapWriter) begin(ctx context.Context) (*apply.Tx, error) {
	tx, err := g.applier.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if g.job.Epoch != 0 {
		if err := apply.CheckLeaderTx(ctx, tx.Conn(), g.job.Slot, g.job.Epoch); err != nil {
			tx.Rollback(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return tx, nil
}

// write writes, in one target transaction, each key of diffs as the snapshot has it: its row at
// (S, 0), or a tombstone at (S, 0) where the snapshot has none.
func (g *gapWriter) write(ctx context.Context, diffs []reconcile.Diff) error {
	t, snap := g.job.Table, g.job.Snapshot
	if n := g.res.Differing + int64(len(diffs)); n > g.limit {
		return fmt.Errorf("%w: more than %d keys of %s differ (at most %.0f%% of its estimated rows, or %d, are repaired): a backfill is cheaper",
			ErrNotComparable, g.limit, t, 100*GapRepairMaxShare, GapRepairMinKeys)
	}
	keys := make([][]string, len(diffs))
	for i, d := range diffs {
		keys[i] = d.Key
	}
	if g.job.BeforeBatch != nil {
		g.job.BeforeBatch(t.String(), g.res.Written)
	}
	tx, err := g.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	written, tombstones, err := writeKeys(ctx, g.src, tx, snap, t, keys)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	g.res.Differing += int64(len(keys))
	g.res.Written += written
	g.res.Tombstones += tombstones
	return nil
}

// finish raises the table's fence to (S, 0) and records the repair, in one transaction: every key
// now holds the source's row at S or a newer version, so no change older than S is to be applied.
func (g *gapWriter) finish(ctx context.Context) error {
	t, s := g.job.Table, g.job.Snapshot.LSN
	tx, err := g.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := tx.RaiseFence(ctx, t, changebatch.Version{LSN: s}); err != nil {
		return err
	}
	err = coverage.RecordGapRepair(ctx, tx.Conn(), coverage.GapRepair{RunID: g.job.RunID, Table: t, S: s, Slot: g.job.Slot,
		Source: g.job.SourceID, KeyColumns: backfill.KeyColumnNames(t), Written: g.res.Written})
	if err != nil {
		return err
	}
	return tx.Commit(ctx)
}
