package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/robfig/cron/v3"
	"github.com/spf13/cobra"
)

// daemonConfig configures `pgconverge run`.
type daemonConfig struct {
	Source, Target string
	// Tables are comma-separated lists of "schema.table" names (changebatch.SplitTableList); empty
	// means the default selection (cdc.DefaultTables).
	Tables      []string
	Slot        string
	Publication string
	// BackfillWorkers chunks are read and applied at once during a backfill; ChunkRows rows make a
	// chunk (one target transaction).
	BackfillWorkers, ChunkRows int
	// SnapshotWarn is how long a backfill may hold its snapshot before it warns; 0 never warns.
	SnapshotWarn time.Duration
	// BackfillSchedule, when set, backfills every selected table again at its ticks while streaming.
	BackfillSchedule cron.Schedule
	// OnGap is what the daemon does with a table whose coverage has a gap at the start of a
	// session: onGapBackfill backfills it before streaming, onGapAlert only reports it.
	OnGap string
	// MetricsAddr, when set, is the HOST:PORT where Prometheus metrics are served.
	MetricsAddr string
	// SyncSequences syncs the sequences of each table after each completed backfill run of it
	// (initial load, gap and scheduled backfills; logSequenceSync).
	SyncSequences bool
	Metrics       *metrics
	Logger        *slog.Logger
	Knobs         daemonKnobs
}

// daemonKnobs are fault-injection hooks for tests; nil hooks do nothing.
type daemonKnobs struct {
	Stream cdc.Knobs
	// AfterLoadChunk runs after each committed chunk of an initial load, with the table's rows
	// loaded so far.
	AfterLoadChunk func(table string, rows int64)
	// Schedule runs at each event of a scheduled backfill tick; AfterScheduledChunk after each
	// committed chunk of a scheduled backfill.
	Schedule            func(scheduleEvent)
	AfterScheduledChunk func(table string, rows int64)
}

// Validate reports every problem of the configuration at once.
func (c *daemonConfig) Validate() error {
	errs := validateURLs(c.Source, c.Target)
	if err := cdc.ValidateSlotName(c.Slot); err != nil {
		errs = append(errs, err)
	}
	if err := cdc.ValidatePublicationName(c.Publication); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, validateBackfillSizes(c.BackfillWorkers, c.ChunkRows, c.SnapshotWarn))
	if c.OnGap != onGapBackfill && c.OnGap != onGapAlert {
		errs = append(errs, fmt.Errorf("--on-gap %q is invalid: use %s or %s", c.OnGap, onGapBackfill, onGapAlert))
	}
	return errors.Join(errs...)
}

func newRunCmd(stderr io.Writer) *cobra.Command {
	cfg := daemonConfig{}
	var logFormat, logLevel, scheduleSpec string
	cmd := &cobra.Command{
		Use:   "run --source URL --target URL [--tables s.t,s.u] [--slot pgconverge] [--publication pgconverge]",
		Short: "Stream changes from the source into the target continuously (loads tables first when needed)",
		Long: `run checks the source, creates the publication and the logical replication slot when missing,
creates missing target tables, loads every table that has no completed load from an exact snapshot,
then streams changes until SIGINT or SIGTERM. URLs default to $PGCONVERGE_SOURCE and $PGCONVERGE_TARGET.

The source needs wal_level = logical, a role with the REPLICATION attribute that may read the tables
and create the publication, and a primary key (or replica identity index) on every table. Changes of
published tables that are not selected are skipped: such a table is loaded again when it is selected.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			sched, schedErr := parseSchedule(scheduleSpec)
			cfg.BackfillSchedule = sched
			if err := errors.Join(cfg.Validate(), schedErr); err != nil {
				return err
			}
			return runDaemon(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	addURLFlags(f, &cfg.Source, &cfg.Target)
	f.StringArrayVar(&cfg.Tables, "tables", nil, "tables to replicate as schema.table, comma-separated or repeated; names fold to lower case unless double-quoted, as in SQL: 'sales.\"Orders\"' (default: the publication's tables, else every table with a primary key)")
	f.StringVar(&cfg.Slot, "slot", "pgconverge", "logical replication slot name")
	f.StringVar(&cfg.Publication, "publication", "pgconverge", "publication name")
	addBackfillFlags(f, &cfg.BackfillWorkers, &cfg.ChunkRows, &cfg.SnapshotWarn)
	f.StringVar(&scheduleSpec, "backfill-schedule", "", `backfill every selected table again on this cron schedule while streaming, for example "0 3 * * *" or @daily (5 fields, an optional leading seconds field, or @every 6h); a tick while the previous backfill runs is skipped`)
	f.StringVar(&cfg.OnGap, "on-gap", onGapBackfill, "what to do with a table whose coverage has a gap (a dropped or invalidated slot, a table that rejoined the publication, a failed backfill) when a session starts: backfill it before streaming, or alert (log at ERROR, set the gap metric, stream on)")
	addSyncSequencesFlag(f, &cfg.SyncSequences)
	f.StringVar(&cfg.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://HOST:PORT/metrics (for example 127.0.0.1:9187); off when empty")
	addLogFlags(f, &logFormat, &logLevel)
	return cmd
}

// runDaemon runs sessions until ctx ends, reconnecting with exponential backoff after transient
// failures of the source or the target; it returns the first permanent failure.
func runDaemon(ctx context.Context, cfg daemonConfig) error {
	if cfg.MetricsAddr != "" {
		cfg.Metrics = newMetrics()
		if err := cfg.Metrics.serve(ctx, cfg.MetricsAddr, cfg.Logger); err != nil {
			return err
		}
	}
	b := backoff.NewExponentialBackOff()
	b.MaxInterval = 30 * time.Second
	for {
		started := time.Now()
		err := runSession(ctx, cfg)
		if ctx.Err() != nil {
			cfg.Logger.Info("daemon stopped on request (SIGINT or SIGTERM)", "slot", cfg.Slot)
			return nil
		}
		if err == nil || !retryable(err) {
			return err
		}
		if time.Since(started) > time.Minute || restartNow(err) {
			b.Reset()
		}
		wait := b.NextBackOff()
		attrs := []any{"err", err, "retry_in", wait.String()}
		if h := hint(err); h != "" {
			attrs = append(attrs, "hint", h)
		}
		if restartNow(err) || enumLabelMissing(err) {
			cfg.Logger.Warn("restarting the session", attrs...)
		} else {
			cfg.Logger.Error("session failed, reconnecting", attrs...)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}
