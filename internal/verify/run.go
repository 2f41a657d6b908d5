package verify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/reconcile"
	"github.com/pgconverge/pgconverge/migrations"
)

// Config configures Run (`pgconverge verify`, and run --verify-schedule).
type Config struct {
	Source, Target string
	// Primary is the URL of Source's primary when Source is a hot standby (pgconverge run --primary).
	Primary string
	// Tables are comma-separated lists of "schema.table" names; none: every table pgconverge
	// replicates into the target.
	Tables []string
	// Ownership makes Schema compare the tables' owners and grants too (`verify --schema
	// --ownership`).
	Ownership bool
	// Repair rewrites every open discrepancy's key from a fresh exact snapshot S' (Run).
	Repair bool
	// NoValues records hashes only, never the rows' values (for regulated data).
	NoValues bool
	// Wait bounds how long to wait for the stream to have applied up to the snapshot (default 2m).
	Wait time.Duration
	// Trigger is coverage.VerifyManual (default) or coverage.VerifySchedule.
	Trigger string
	// LeafRows is reconcile.Config.LeafRows (0: its default).
	LeafRows int
	// Incremental skips, per table, the key-hash groups the last verify found equal and that have
	// not changed since (`verify --incremental`). Off (the default), every row of every table is
	// hashed as one whole-table checksum, which still records what it finds for a later
	// incremental run. Measured on 2M rows: an unchanged table takes 0.85× the full verify's
	// time, a table with any change since 1.5–2× (docs/benchmarks.md), so it pays only for
	// tables that mostly stand still.
	Incremental bool
	// GroupBits is reconcile.Incremental.Bits: the key-hash bits a table is grouped by once a
	// verify finds a change in it (0: chosen from the table's estimated rows).
	GroupBits int
	// AuditRetention: at its end the run deletes the suppressed-replay audit rows older than
	// this (coverage.PruneSuppressedReplays); 0 deletes none.
	AuditRetention time.Duration
	Logger         *slog.Logger
	Monitor        Monitor
	// BeforeRepairCommit, a test hook, runs before each repair transaction commits.
	BeforeRepairCommit func(table string)
	// Pacer paces the comparison's reads of the source (reconcile.Config.Pace): each table waits
	// while it is held, and each checksum query counts the table's source rows and the bytes it
	// fetched against its rate limits. nil reads as fast as the databases go.
	Pacer *pacing.Pacer
}

// Validate reports every problem of the configuration at once.
func (c *Config) Validate() error {
	errs := pgsession.ValidateURLs(c.Source, c.Target)
	if c.Wait < 0 {
		errs = append(errs, fmt.Errorf("--wait %s: must not be negative", c.Wait))
	}
	return errors.Join(errs...)
}

// Report is what a verify run did; its JSON form is `pgconverge verify --format json`
// (docs/verify.md).
type Report struct {
	RunID int64 `json:"run_id"`
	// Snapshot is S, the source's exact snapshot; RepairSnapshot S' (with --repair).
	Snapshot       string  `json:"snapshot_lsn"`
	RepairSnapshot string  `json:"repair_snapshot_lsn,omitempty"`
	HashMode       string  `json:"hash_mode"`
	Tables         []Table `json:"tables"`
	// Found, Repaired and Open sum the tables' counts.
	Found    int64 `json:"found"`
	Repaired int64 `json:"repaired"`
	Open     int64 `json:"open"`
}

// Table is one table's part of a Report.
type Table struct {
	Table string `json:"table"`
	// State is "compared", "skipped" (Reason says why: not loaded yet, not followed by a
	// stream) or "failed" (Reason holds the error).
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// SourceRows are the rows the snapshot shows, RowsCompared those compared; MovedOn the target
	// rows newer than S, not compared (the stream has moved them on).
	SourceRows   int64 `json:"source_rows"`
	RowsCompared int64 `json:"rows_compared"`
	MovedOn      int64 `json:"moved_on"`
	// RangesChecked counts the key-hash groups whose checksums were compared; RowsFetched and
	// BytesFetched what was read from both sides.
	RangesChecked int64 `json:"ranges_checked"`
	// GroupsSkipped counts the key-hash groups left out as unchanged on both sides since the
	// last verify found them equal (docs/verify.md, "Incremental verify"); FullReason says why
	// no group could be skipped (no earlier verify, no --incremental, a cluster or the table changed…).
	GroupsSkipped  int64   `json:"groups_skipped"`
	FullReason     string  `json:"full_reason,omitempty"`
	RowsFetched    int64   `json:"rows_fetched"`
	BytesFetched   int64   `json:"bytes_fetched"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	// Found counts this run's discrepancies by kind; New those recorded for the first time (the
	// rest were known); ClosedEqual earlier ones found equal now; Repaired those repaired; Open
	// what is left open.
	Found       map[string]int64 `json:"found"`
	New         int64            `json:"new"`
	ClosedEqual int64            `json:"closed_equal"`
	Repaired    int64            `json:"repaired"`
	Open        int64            `json:"open"`
}

// verifyTable is one table of a verify run.
type verifyTable struct {
	changebatch.Table
	slot string
	rep  *Table
}

// verifyRun is the state of one Verify.
type verifyRun struct {
	cfg           Config
	src, tgt, led *pgx.Conn // led writes the ledger while tgt holds the comparison's transaction
	runID         int64
	snap          backfill.Snapshot
	repairLSN     pglogrepl.LSN // S' of the repair, 0 without one
	mode          reconcile.HashMode
	tables        []*verifyTable
}

// Run compares the tables between the source at an exact snapshot S and the target, once the
// stream has applied up to S (docs/design.md, "Reconciliation"): target rows newer than S are
// not compared; every other key is, by checksums narrowed down to keys (package reconcile). Each
// discrepancy is upserted into pgconverge.discrepancies on its deterministic id; earlier open
// ones found equal are closed. With Repair, every open discrepancy's key is then read again at a
// fresh exact snapshot S' and written through the apply step at version (S', 0) (a tombstone
// where the source has no row), closing the discrepancy in the same target transaction.
//
// It returns the report and an error when the run could not be done, or when a table named in
// Tables could not be compared (ErrNotVerified).
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Wait == 0 {
		cfg.Wait = 2 * time.Minute
	}
	if cfg.Trigger == "" {
		cfg.Trigger = coverage.VerifyManual
	}
	if cfg.Monitor == nil {
		cfg.Monitor = nopMonitor{}
	}
	v := &verifyRun{cfg: cfg}
	var err error
	if v.src, v.tgt, err = pgsession.ConnectBoth(ctx, cfg.Source, cfg.Target); err != nil {
		return Report{}, err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), v.src, v.tgt)
	if v.led, err = pgsession.Connect(ctx, cfg.Target, "target"); err != nil {
		return Report{}, err
	}
	defer v.led.Close(context.WithoutCancel(ctx))
	if err := v.prepare(ctx); err != nil {
		return Report{}, err
	}
	rep, err := v.run(ctx)
	if err == nil && len(cfg.Tables) > 0 {
		// A run that could not compare a table it was asked for is recorded failed, with why.
		err = notVerified(rep)
	}
	end := coverage.VerifyRunEnd{Snapshot: v.snap.LSN, Repair: v.repairLSN, HashMode: v.mode.String(), Tables: len(v.tables),
		Found: rep.Found, Repaired: rep.Repaired, Open: rep.Open, Err: err}
	if endErr := coverage.EndVerifyRun(context.WithoutCancel(ctx), v.led, v.runID, end); err == nil {
		err = endErr
	}
	if _, perr := coverage.PruneSuppressedReplays(ctx, v.led, cfg.AuditRetention); err == nil {
		err = perr
	}
	return rep, err
}

// ErrNotVerified is wrapped by Run's error when a table named in Config.Tables was
// skipped or failed.
var ErrNotVerified = errors.New("not every table was verified")

func notVerified(rep Report) error {
	var errs []error
	for _, t := range rep.Tables {
		if t.State != "compared" {
			errs = append(errs, fmt.Errorf("%s %s: %s", t.Table, t.State, t.Reason))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrNotVerified, errors.Join(errs...))
}

// prepare checks both sides, brings the metadata schema up to date, records the run and
// describes the tables.
func (v *verifyRun) prepare(ctx context.Context) error {
	if err := pgsession.CheckDistinct(ctx, v.src, v.tgt); err != nil {
		return err
	}
	if err := cdc.CheckSource(ctx, v.src); err != nil {
		return fmt.Errorf("%w (verify takes its exact snapshot from a temporary logical replication slot)", err)
	}
	if err := cdc.CheckStandbyPrimary(ctx, v.src, v.cfg.Primary, v.cfg.Logger); err != nil {
		return err
	}
	if err := migrations.Apply(ctx, v.tgt); err != nil {
		return err
	}
	if v.cfg.Repair {
		if err := coverage.RefuseIfCutOver(ctx, v.tgt, "verify --repair"); err != nil {
			return err
		}
	}
	var names []changebatch.TableName
	if len(v.cfg.Tables) > 0 {
		var err error
		if names, err = changebatch.ParseTableList(v.cfg.Tables); err != nil {
			return fmt.Errorf("--table: %w", err)
		}
	} else {
		reg, err := apply.RegisteredTables(ctx, v.tgt)
		if err != nil {
			return err
		}
		for _, t := range reg {
			names = append(names, t.TableName)
		}
	}
	var err error
	if v.runID, err = coverage.StartVerifyRun(ctx, v.led, v.cfg.Trigger); err != nil {
		return err
	}
	for _, n := range names {
		if slices.ContainsFunc(v.tables, func(t *verifyTable) bool { return t.TableName == n }) {
			continue
		}
		vt := &verifyTable{Table: changebatch.Table{TableName: n}, rep: &Table{Table: n.String(), State: "compared", Found: map[string]int64{}}}
		v.tables = append(v.tables, vt)
		if vt.Table, err = cdc.DescribeTable(ctx, v.src, n.Schema, n.Name); err != nil {
			vt.fail(err)
			continue
		}
		if vt.SnapshotOnly != "" {
			vt.fail(errSkip("kept by snapshots only (" + vt.SnapshotOnly + "): the target holds it as of its last backfill, not as of a new snapshot"))
			continue
		}
		vt.slot, err = v.followedBy(ctx, n)
		if err == nil {
			err = backfillrun.ReadLedgerPublicationShape(ctx, v.src, v.tgt, &vt.Table)
		}
		if err != nil {
			vt.fail(err)
		}
	}
	return nil
}

// followedBy returns the slot that follows table n, or records why n is skipped.
func (v *verifyRun) followedBy(ctx context.Context, n changebatch.TableName) (string, error) {
	f, err := coverage.ReadFollowed(ctx, v.tgt, n)
	switch {
	case errors.Is(err, coverage.ErrUnknownTable):
		return "", fmt.Errorf("%s is not replicated into the target (not in pgconverge.tables): name a table `pgconverge run` follows", n)
	case err != nil:
		return "", err
	case !f.Loaded:
		return "", errSkip("not loaded: its initial load or reload has not completed; verify it once `pgconverge run` has loaded it")
	case f.Slot == "":
		return "", errSkip("not followed by a stream since its last load, so its rows are as of that load: run `pgconverge run` to follow it")
	}
	return f.Slot, nil
}

// errSkip is the reason a table is skipped rather than failed.
type errSkip string

func (e errSkip) Error() string { return string(e) }

func (t *verifyTable) fail(err error) {
	var skip errSkip
	if errors.As(err, &skip) {
		t.rep.State, t.rep.Reason = "skipped", skip.Error()
		return
	}
	t.rep.State, t.rep.Reason = "failed", err.Error()
}

func (t *verifyTable) ok() bool { return t.rep.State == "compared" }

// run takes the snapshot, waits for the streams to pass it, compares each table, repairs, and
// returns the report.
func (v *verifyRun) run(ctx context.Context) (Report, error) {
	var rep Report
	rep.RunID = v.runID
	exp, err := backfill.Export(ctx, v.cfg.Source, v.cfg.Primary, pgsession.LogSlotWait(v.cfg.Logger))
	if err != nil {
		return rep, err
	}
	defer exp.Close(context.WithoutCancel(ctx))
	v.snap = exp.Snapshot
	rep.Snapshot = v.snap.LSN.String()
	if v.mode, err = reconcile.Probe(ctx, v.src, v.tgt); err != nil {
		return rep, err
	}
	rep.HashMode = v.mode.String()
	v.cfg.Logger.Info("verify: snapshot taken", "run", v.runID, "snapshot_lsn", v.snap.LSN.String(), "tables", len(v.tables), "hash", v.mode)
	if err := v.waitStreams(ctx); err != nil {
		return rep, err
	}
	if err := v.compareAll(ctx); err != nil {
		return rep, err
	}
	if v.cfg.Repair {
		if err = v.repairAll(ctx); v.repairLSN != 0 {
			rep.RepairSnapshot = v.repairLSN.String()
		}
	}
	return v.report(ctx, rep), err
}

// compareAll compares every table in one REPEATABLE READ transaction on the target, begun as soon
// as the streams have passed S, so that as few target rows as possible have moved on past S.
func (v *verifyRun) compareAll(ctx context.Context) error {
	ttx, err := v.tgt.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("begin the target's transaction: %w", err)
	}
	defer ttx.Rollback(context.WithoutCancel(ctx))
	for _, t := range v.tables {
		if !t.ok() {
			continue
		}
		if err := v.cfg.Pacer.Wait(ctx); err != nil {
			return err
		}
		start := time.Now()
		if err := v.compare(ctx, ttx, t); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			t.fail(err)
		}
		t.rep.ElapsedSeconds = time.Since(start).Seconds()
	}
	return nil
}

// report fills rep with the tables' counts and what is left open.
func (v *verifyRun) report(ctx context.Context, rep Report) Report {
	for _, t := range v.tables {
		if t.ok() {
			if n, err := coverage.CountOpenDiscrepancies(ctx, v.led, t.TableName); err == nil {
				t.rep.Open = n
			} else {
				t.fail(err)
			}
		}
		for _, n := range t.rep.Found {
			rep.Found += n
		}
		rep.Repaired += t.rep.Repaired
		rep.Open += t.rep.Open
		rep.Tables = append(rep.Tables, *t.rep)
		v.cfg.Logger.Info("verify: table", "table", t.rep.Table, "state", t.rep.State, "reason", t.rep.Reason,
			"rows_compared", t.rep.RowsCompared, "ranges", t.rep.RangesChecked, "rows_fetched", t.rep.RowsFetched,
			"found", t.rep.Found, "repaired", t.rep.Repaired, "open", t.rep.Open, "elapsed_s", t.rep.ElapsedSeconds)
	}
	return rep
}

// waitStreams waits until the progress of every slot that follows a table to compare has reached
// S on the target, so that every source change before S is in the target.
func (v *verifyRun) waitStreams(ctx context.Context) error {
	deadline := time.Now().Add(v.cfg.Wait)
	for _, t := range v.tables {
		if !t.ok() {
			continue
		}
		for {
			applied, _, err := apply.ReadProgress(ctx, v.tgt, t.slot)
			if err != nil {
				return err
			}
			if applied >= v.snap.LSN {
				break
			}
			if time.Now().After(deadline) {
				t.fail(fmt.Errorf("the stream of slot %q has applied the source up to %s, behind the snapshot %s, after waiting %s: is `pgconverge run` running and caught up? (--wait sets how long verify waits)",
					t.slot, applied, v.snap.LSN, v.cfg.Wait))
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}
