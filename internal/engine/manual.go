package engine

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
	"github.com/pgconverge/pgconverge/migrations"
)

// BackfillConfig configures Backfill (`pgconverge backfill`).
type BackfillConfig struct {
	Source, Target string
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
	// SyncSequences syncs the sequences of each completed table after the run (syncSequences).
	SyncSequences bool
	Logger        *slog.Logger
	// Progress reports rows (NewLogProgress, or the CLI's progress bar); nil reports nothing.
	Progress Progress
	// AfterChunk and AfterMergedBatch are test hooks (backfillJob).
	AfterChunk       func(table string, rows int64)
	AfterMergedBatch func()
}

// Validate reports every problem of the configuration at once.
func (c *BackfillConfig) Validate() error {
	errs := validateURLs(c.Source, c.Target)
	if len(c.Tables) == 0 {
		errs = append(errs, errors.New("no table: name each table to backfill with --table schema.table"))
	}
	errs = append(errs, validateBackfillSizes(c.Workers, c.ChunkRows, c.SnapshotWarn))
	return errors.Join(errs...)
}

// Backfill is `pgconverge backfill`: it checks the source and the tables, prepares the target
// (metadata schema, types, tables) and runs one backfill run of the tables (runBackfill) with
// trigger "manual", then, with SyncSequences, syncs the sequences of the tables it completed. A
// failed sync returns the report with an error wrapping ErrSequencesNotSynced.
func Backfill(ctx context.Context, cfg BackfillConfig) (BackfillReport, error) {
	if cfg.Progress == nil {
		cfg.Progress = nopProgress{}
	}
	src, tgt, err := connectBoth(ctx, cfg.Source, cfg.Target)
	if err != nil {
		return BackfillReport{}, err
	}
	defer closeBoth(context.WithoutCancel(ctx), src, tgt)
	if err := checkDistinct(ctx, src, tgt); err != nil {
		return BackfillReport{}, err
	}
	if err := cdc.CheckSource(ctx, src); err != nil {
		return BackfillReport{}, fmt.Errorf("%w (a backfill takes its exact snapshot from a temporary logical replication slot)", err)
	}
	tables, err := describeTables(ctx, src, cfg.Tables)
	if err != nil {
		return BackfillReport{}, err
	}
	if err := migrations.Apply(ctx, tgt); err != nil {
		return BackfillReport{}, err
	}
	if err := refuseCutOver(ctx, tgt, "backfill"); err != nil {
		return BackfillReport{}, err
	}
	for i := range tables {
		if err := readLedgerPublicationShape(ctx, src, tgt, &tables[i]); err != nil {
			return BackfillReport{}, err
		}
	}
	srcID, err := cdc.SourceID(ctx, src)
	if err != nil {
		return BackfillReport{}, err
	}
	for _, t := range tables {
		if err := coverage.CheckTableSource(ctx, tgt, t.TableName, srcID); err != nil {
			return BackfillReport{}, err
		}
	}
	if _, err := ensureTables(ctx, src, tgt, tables, cfg.Logger); err != nil {
		return BackfillReport{}, err
	}
	busy := busyFail
	if cfg.Wait {
		busy = busyWait
	}
	rep, err := runBackfill(ctx, backfillJob{
		Source: cfg.Source, Target: cfg.Target, Tables: tables, Trigger: coverage.TriggerManual,
		Workers: cfg.Workers, ChunkRows: cfg.ChunkRows, BatchRows: backfillBatchRows,
		Resume: cfg.Resume, Busy: busy, SnapshotWarn: cfg.SnapshotWarn, Logger: cfg.Logger,
		Progress: cfg.Progress, AfterChunk: cfg.AfterChunk, AfterMergedBatch: cfg.AfterMergedBatch,
	})
	if err != nil || !cfg.SyncSequences || rep.RunID == 0 {
		return rep, err
	}
	rep.Sequences, err = syncSequencesAt(ctx, cfg.Source, cfg.Target, completedTables(tables, rep), cfg.Logger)
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
