package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/schedule"
	"github.com/spf13/cobra"
)

// exitUnreachable is the exit status of `pgconverge run` when the source or the target could not
// be reached before the daemon ever connected (engine.ErrUnreachable): a supervisor may start it
// again later, unlike after exit 1 (a configuration problem retrying cannot fix).
const exitUnreachable = 5

func newRunCmd(stderr io.Writer, budget *byteSize) *cobra.Command {
	cfg := engine.Config{}
	var logFormat, logLevel, scheduleSpec, verifySpec, snapshotSpec, metricsAddr string
	var profiles bool
	var limits rateLimitFlags
	var walBudget byteCount
	cmd := &cobra.Command{
		Use:   "run --source URL --target URL [--tables s.t,s.u] [--slot pgconverge] [--publication pgconverge]",
		Short: "Stream changes from the source into the target continuously (loads tables first when needed)",
		Long: `run checks the source, creates the publication and the logical replication slot when missing,
creates missing target tables, loads every table that has no completed load from an exact snapshot,
then streams changes until SIGINT or SIGTERM. URLs default to $PGCONVERGE_SOURCE and $PGCONVERGE_TARGET.

The source needs wal_level = logical, a role with the REPLICATION attribute that may read the tables
and create the publication. A table with a primary key (not DEFERRABLE) or a replica identity index
is streamed by its key, one with REPLICA IDENTITY FULL and no such key by whole rows; one that no
publication can carry (UNLOGGED, REPLICA IDENTITY NOTHING, no key and not FULL) is kept by
snapshots (--snapshot-schedule). Changes of published tables that are not selected are skipped:
such a table is loaded again when it is selected.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Limits, cfg.WALBudget = limits.limits(), int64(walBudget)
			logger, err := newLogger(stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			sched, schedErr := schedule.Parse(scheduleSpec)
			if schedErr != nil {
				schedErr = fmt.Errorf("--backfill-schedule: %w", schedErr)
			}
			vsched, vschedErr := schedule.Parse(verifySpec)
			if vschedErr != nil {
				vschedErr = fmt.Errorf("--verify-schedule: %w", vschedErr)
			}
			ssched, sschedErr := schedule.Parse(snapshotSpec)
			if sschedErr != nil {
				sschedErr = fmt.Errorf("--snapshot-schedule: %w", sschedErr)
			}
			cfg.BackfillSchedule, cfg.VerifySchedule, cfg.SnapshotSchedule = sched, vsched, ssched
			if err := errors.Join(cfg.Validate(), schedErr, vschedErr, sschedErr); err != nil {
				return err
			}
			if profiles && metricsAddr == "" {
				return errors.New("--pprof serves on --metrics-addr: pass --metrics-addr 127.0.0.1:PORT too")
			}
			if metricsAddr != "" {
				m := newMetrics()
				if err := m.serve(cmd.Context(), metricsAddr, profiles, logger); err != nil {
					return err
				}
				cfg.Monitor = m
			}
			cfg.MemoryBudget = int64(*budget)
			reloadLimitsOnHangup(cmd.Context(), cmd, logger, func(ctx context.Context, change func(*pacing.Limits)) (pacing.Limits, error) {
				return operator.SetRateLimits(ctx, cfg.Target, cfg.Slot, change, "SIGHUP: "+cmd.Flag("config").Value.String())
			})
			err = engine.Run(cmd.Context(), cfg)
			if errors.Is(err, engine.ErrUnreachable) {
				return exitError{Code: exitUnreachable, Err: err}
			}
			return err
		},
	}
	f := cmd.Flags()
	addURLFlags(f, &cfg.Source, &cfg.Target)
	addPrimaryFlag(f, &cfg.Primary)
	f.StringArrayVar(&cfg.Tables, "tables", nil, "tables to replicate as schema.table, comma-separated or repeated; names fold to lower case unless double-quoted, as in SQL: 'sales.\"Orders\"'; an unquoted * or ? makes a pattern, matched again as tables come: 'public.*,sales.order_*' (default: every table pgconverge can carry: the publication's tables, else every table it can stream, and the tables no publication can carry, kept by snapshots)")
	f.StringVar(&cfg.Slot, "slot", "pgconverge", "logical replication slot name")
	f.StringVar(&cfg.Publication, "publication", "pgconverge", "publication name")
	addFailoverSlotFlag(f, &cfg.FailoverSlot)
	addStreamInProgressFlag(f, &cfg.StreamInProgress)
	addBackfillFlags(f, &cfg.BackfillWorkers, &cfg.ChunkRows, &cfg.SnapshotWarn)
	f.StringVar(&scheduleSpec, "backfill-schedule", "", `backfill every selected table again on this cron schedule while streaming, for example "0 3 * * *" or @daily (5 fields, an optional leading seconds field, or @every 6h); a tick while the previous backfill runs is skipped`)
	f.StringVar(&snapshotSpec, "snapshot-schedule", "@hourly", `backfill the tables no publication can carry (UNLOGGED, REPLICA IDENTITY NOTHING, or without a key and without REPLICA IDENTITY FULL: kept by snapshots only) again on this cron schedule; "" loads them only when they were never loaded`)
	f.StringVar(&verifySpec, "verify-schedule", "", `verify every selected table on this cron schedule while streaming (as pgconverge verify does), for example "@every 6h"; a tick while the previous verify runs is skipped`)
	f.BoolVar(&cfg.VerifyRepair, "verify-repair", false, "repair what a scheduled verify finds (as verify --repair)")
	addAuditRetentionFlag(f, &cfg.AuditRetention)
	f.DurationVar(&cfg.TombstoneRetention, "tombstone-retention", 24*time.Hour, "keep tombstones (target rows of deleted source rows) at least this long after they were applied; older ones are deleted hourly once no slot, backfill or verify could still deliver an older change of their key; 0 keeps them forever")
	f.StringVar(&cfg.LiveSuffix, "live-suffix", "_live", "keep a view of each target table's live rows, without tombstones and metadata columns, in the schema named its schema plus this suffix (public.orders: public_live.orders); '' keeps none")
	f.StringVar(&cfg.OnGap, "on-gap", engine.OnGapRepair, "what to do with a table whose coverage has a gap (a dropped or invalidated slot, a table that rejoined the publication, a failed backfill) when a session starts: repair it by comparison before streaming (compare at the new snapshot as verify does and write only the keys that differ; a table without a key or partitioned is backfilled), backfill it before streaming (every row read and written again), or alert (log at ERROR, set the gap metric, stream on); past 5% of a table's rows differing the repair backfills the table instead). Measured on 2M rows with 1% changed in the gap: repair closed it 2.0-2.6x sooner and wrote 100x fewer rows")
	addRateLimitFlags(f, &limits, "its backfills and verifies (each)")
	addPacingFlags(f, &walBudget, &cfg.Pacing)
	addChunkTimeCapFlag(f, &cfg.ChunkTimeCap)
	addSyncSequencesFlag(f, &cfg.SyncSequences)
	f.BoolVar(&cfg.CopyIndexes, "copy-indexes", false, "build the source's secondary indexes on each target table once it is loaded (CREATE INDEX CONCURRENTLY), and follow the source's new and dropped indexes each minute; a unique index or constraint is built without its uniqueness until cutover --finalize (for a migration: the target is query-ready before the switchover)")
	f.BoolVar(&profiles, "pprof", false, "also serve Go's runtime profiles (net/http/pprof) at /debug/pprof/ on --metrics-addr, for go tool pprof; keep that address private")
	f.StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://HOST:PORT/metrics (for example 127.0.0.1:9187; a port alone, :9187, listens on 127.0.0.1 only, and 0.0.0.0:9187 on every interface); off when empty")
	addLogFlags(f, &logFormat, &logLevel)
	return cmd
}
