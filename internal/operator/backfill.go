package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/sequences"
	"github.com/pgconverge/pgconverge/migrations"
)

// BackfillConfig configures Backfill (`pgconverge backfill`).
type BackfillConfig struct {
	Source, Target string
	// Primary is the URL of Source's primary when Source is a hot standby (pgconverge run --primary).
	Primary string
	// Tables are comma-separated lists of "schema.table" names (changebatch.ParseTableList).
	Tables []string
	// Workers chunks are read and applied at once; ChunkRows rows make a chunk (the unit of
	// parallel reading and of resuming).
	Workers, ChunkRows int
	// SnapshotWarn is how long the run may hold its snapshot before it warns; 0 never warns.
	SnapshotWarn time.Duration
	// Resume keeps the completed chunks of a table's interrupted backfill; Wait waits for another
	// backfill of a table to end instead of failing.
	Resume, Wait bool
	// SyncSequences syncs the sequences of each completed table after the run (sequences.SyncTables).
	SyncSequences bool
	Logger        *slog.Logger
	// Progress reports rows (backfillrun.NewLogProgress, or the CLI's progress bar); nil reports nothing.
	Progress backfillrun.Progress
	// AfterChunk and AfterMergedBatch are test hooks (backfillrun.Job).
	AfterChunk       func(table string, rows int64)
	AfterMergedBatch func()
	// Lease is the run's lease timings (backfillrun.Job.Lease); unset ones are the production
	// ones. Tests set shorter ones.
	Lease lease.Timings
	// Monitor counts the run's chunks, conflicts and split reads (backfillrun.Monitor); nil counts
	// nothing.
	Monitor backfillrun.Monitor
	// ChunkTimeCap is backfillrun.Job.ChunkTimeCap (--chunk-time-cap).
	ChunkTimeCap time.Duration
	// Pacer paces the run's reads (backfillrun.Job.Pacer: --max-rows-per-second,
	// --max-bytes-per-second); nil reads as fast as the workers go.
	Pacer *pacing.Pacer
}

// Validate reports every problem of the configuration at once.
func (c *BackfillConfig) Validate() error {
	errs := pgsession.ValidateURLs(c.Source, c.Target)
	if len(c.Tables) == 0 {
		errs = append(errs, errors.New("no table: name each table to backfill with --table schema.table"))
	}
	errs = append(errs, backfillrun.ValidateSizes(c.Workers, c.ChunkRows, c.SnapshotWarn))
	if c.ChunkTimeCap < 0 {
		errs = append(errs, fmt.Errorf("--chunk-time-cap %s is negative: use 0 for no cap", c.ChunkTimeCap))
	}
	return errors.Join(errs...)
}

// Backfill is `pgconverge backfill`: it checks the source and the tables, prepares the target
// (metadata schema, types, tables) and runs one backfill run of the tables (Run) with
// trigger "manual", then, with SyncSequences, syncs the sequences of the tables it completed. A
// failed sync returns the report with an error wrapping ErrSequencesNotSynced.
func Backfill(ctx context.Context, cfg BackfillConfig) (backfillrun.Report, error) {
	if cfg.Progress == nil {
		cfg.Progress = backfillrun.NopProgress{}
	}
	src, tgt, err := pgsession.ConnectBoth(ctx, cfg.Source, cfg.Target)
	if err != nil {
		return backfillrun.Report{}, err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), src, tgt)
	if err := pgsession.CheckDistinct(ctx, src, tgt); err != nil {
		return backfillrun.Report{}, err
	}
	if err := cdc.CheckSource(ctx, src); err != nil {
		return backfillrun.Report{}, fmt.Errorf("%w (a backfill takes its exact snapshot from a temporary logical replication slot)", err)
	}
	if err := cdc.CheckStandbyPrimary(ctx, src, cfg.Primary, cfg.Logger); err != nil {
		return backfillrun.Report{}, err
	}
	tables, err := describeTables(ctx, src, cfg.Tables)
	if err != nil {
		return backfillrun.Report{}, err
	}
	if err := migrations.Apply(ctx, tgt); err != nil {
		return backfillrun.Report{}, err
	}
	if err := coverage.RefuseIfCutOver(ctx, tgt, "backfill"); err != nil {
		return backfillrun.Report{}, err
	}
	for i := range tables {
		if err := backfillrun.ReadLedgerPublicationShape(ctx, src, tgt, &tables[i]); err != nil {
			return backfillrun.Report{}, err
		}
	}
	srcID, err := cdc.SourceID(ctx, src)
	if err != nil {
		return backfillrun.Report{}, err
	}
	for _, t := range tables {
		if err := coverage.CheckTableSource(ctx, tgt, t.TableName, srcID); err != nil {
			return backfillrun.Report{}, err
		}
	}
	if _, err := backfillrun.EnsureTables(ctx, src, tgt, tables, cfg.Logger); err != nil {
		return backfillrun.Report{}, err
	}
	busy := backfillrun.BusyFail
	if cfg.Wait {
		busy = backfillrun.BusyWait
	}
	rep, err := backfillrun.Run(ctx, backfillrun.Job{
		Source: cfg.Source, Primary: cfg.Primary, Target: cfg.Target, Tables: tables, Trigger: coverage.TriggerManual,
		Workers: cfg.Workers, ChunkRows: cfg.ChunkRows, BatchRows: backfillrun.BatchRows,
		Resume: cfg.Resume, Busy: busy, SnapshotWarn: cfg.SnapshotWarn, Logger: cfg.Logger,
		Progress: cfg.Progress, AfterChunk: cfg.AfterChunk, AfterMergedBatch: cfg.AfterMergedBatch,
		Lease: cfg.Lease, Pacer: cfg.Pacer, ChunkTimeCap: cfg.ChunkTimeCap, Monitor: cfg.Monitor,
	})
	if err != nil || !cfg.SyncSequences || rep.RunID == 0 {
		return rep, err
	}
	rep.Sequences, err = sequences.SyncTables(ctx, cfg.Source, cfg.Primary, cfg.Target, rep.Completed(tables), cfg.Logger)
	if err != nil {
		return rep, fmt.Errorf("%w: %w", ErrSequencesNotSynced, err)
	}
	return rep, nil
}

// ErrSequencesNotSynced marks the error of a backfill that completed but could not sync every
// sequence (--sync-sequences): its report is still printed.
var ErrSequencesNotSynced = errors.New("backfill completed, but sequences were not all synced")

// describeTables parses the table lists and describes each table on the source; every problem is
// reported at once.
func describeTables(ctx context.Context, src *pgx.Conn, lists []string) ([]changebatch.Table, error) {
	var out []changebatch.Table
	var errs []error
	seen := map[changebatch.TableName]bool{}
	names, err := changebatch.ParseTableList(lists)
	if err != nil {
		errs = append(errs, fmt.Errorf("--table: %w", err))
	}
	for _, n := range names {
		t, err := cdc.DescribeTable(ctx, src, n.Schema, n.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !seen[t.TableName] {
			seen[t.TableName] = true
			out = append(out, t)
		}
	}
	return out, errors.Join(errs...)
}
