package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/pgconverge/pgconverge/internal/pacing"

	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

func newBackfillCmd(stdout, stderr io.Writer) *cobra.Command {
	cfg := operator.BackfillConfig{}
	var logFormat, logLevel string
	var join, set bool
	var runID int64
	var limits rateLimitFlags
	var slot string
	cmd := &cobra.Command{
		Use:   "backfill --source URL --target URL (--table s.t [--table ...] | --join [--run ID]) [--workers N] [--chunk-rows N]",
		Short: "Copy tables from an exact snapshot of the source into the target, safely next to a running stream",
		Long: `backfill reads every row of the named tables from one exact snapshot of the source (a temporary
logical slot's exported snapshot, whose consistent point is the snapshot LSN S) and applies them at
version (S, 0) through the same version-guarded upsert as the stream, so it may run while
` + "`pgconverge run`" + ` streams the same tables: whichever path holds the newer version wins.

Tables are cut into chunks of --chunk-rows rows along the primary key; --workers chunks are read and
applied in parallel. A chunk the target holds none of is copied in one transaction with its ledger
row; otherwise it is merged batch by batch in short transactions, so the stream is never blocked
for long. If a run is interrupted (kill -9, SIGTERM, a lost connection), running the same command
again keeps what was completed and reads the rest from a new snapshot. Missing target tables are
created. When a table is complete, target rows the source no longer has become tombstones
(_cdc_deleted). Exit status: 0 when every table completed, 1 on an error or an interruption.

With --join, the command adds --workers workers to a run another process is running (a
backfill, or a daemon's initial load or scheduled backfill), typically from another host: they
claim the run's chunks in the target's ledger and read each at the run's own snapshot. It takes
no --table and exits 0 when the run ends; killing it costs no data (its chunks are claimable
again at once). URLs default to $PGCONVERGE_SOURCE and $PGCONVERGE_TARGET.

--max-rows-per-second and --max-bytes-per-second limit what the process reads from the source, all
its workers together; a SIGHUP reloads them from --config. With --set, the command backfills nothing:
it changes the rate limits of the running daemon of --slot (its backfills and verifies each), which
follows within a second and keeps them until its next start (pgconverge status shows them).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if set {
				return setDaemonLimits(cmd, stdout, cfg.Target, slot, limits)
			}
			logger, err := newLogger(stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			cfg.Pacer = pacing.New(limits.limits(), nil)
			reloadLimitsOnHangup(cmd.Context(), cmd, logger, setPacerLimits(cfg.Pacer))
			if cfg.Progress == nil {
				f, ok := stderr.(*os.File)
				cfg.Progress = newProgress(stderr, ok && term.IsTerminal(int(f.Fd())), "backfill", logger, 10*time.Second)
			}
			if join || runID != 0 {
				return runJoin(cmd, stdout, cfg, runID)
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			rep, err := operator.Backfill(cmd.Context(), cfg)
			if errors.Is(err, operator.ErrSequencesNotSynced) {
				printBackfillReport(stdout, rep)
				return err
			}
			switch {
			case cmd.Context().Err() != nil && rep.RunID != 0:
				// Not wrapping context.Canceled: an interrupted backfill must not exit 0.
				return fmt.Errorf("backfill run %d interrupted: run the same command again to resume it (completed chunks are kept)", rep.RunID)
			case cmd.Context().Err() != nil:
				return errors.New("backfill interrupted before it started")
			case err != nil:
				return err
			}
			printBackfillReport(stdout, rep)
			return nil
		},
	}
	f := cmd.Flags()
	addURLFlags(f, &cfg.Source, &cfg.Target)
	addPrimaryFlag(f, &cfg.Primary)
	f.StringArrayVar(&cfg.Tables, "table", nil, "table to backfill as schema.table, repeated or comma-separated; unquoted names fold to lower case as in SQL")
	addBackfillFlags(f, &cfg.Workers, &cfg.ChunkRows, &cfg.SnapshotWarn)
	f.BoolVar(&cfg.Resume, "resume", true, "keep the completed chunks of an interrupted backfill of a table and read only the rest; --resume=false starts over")
	f.BoolVar(&cfg.Wait, "wait", false, "wait for another running backfill of a table to end instead of failing; with --join, wait for a run to join")
	f.BoolVar(&join, "join", false, "add this process's --workers to a backfill run another process is running (from another host, say) instead of starting one")
	f.Int64Var(&runID, "run", 0, "with --join: the id of the run to join (default: the newest running run)")
	addSyncSequencesFlag(f, &cfg.SyncSequences)
	addRateLimitFlags(f, &limits, "this backfill")
	addChunkTimeCapFlag(f, &cfg.ChunkTimeCap)
	f.BoolVar(&set, "set", false, "backfill nothing: change the rate limits of the running daemon of --slot to the --max-rows-per-second and --max-bytes-per-second given")
	f.StringVar(&slot, "slot", "pgconverge", "with --set: the slot of the daemon whose rate limits to change")
	addLogFlags(f, &logFormat, &logLevel)
	return cmd
}

// runJoin runs `backfill --join` with the flags of cfg and prints what it did.
func runJoin(cmd *cobra.Command, stdout io.Writer, cfg operator.BackfillConfig, runID int64) error {
	if len(cfg.Tables) > 0 {
		return errors.New("--join takes the tables of the run it joins: drop --table")
	}
	jc := backfillrun.JoinConfig{Source: cfg.Source, Target: cfg.Target, Run: runID, Workers: cfg.Workers, Wait: cfg.Wait,
		Logger: cfg.Logger, Progress: cfg.Progress, Pacer: cfg.Pacer}
	if err := jc.Validate(); err != nil {
		return err
	}
	rep, err := backfillrun.Join(cmd.Context(), jc)
	switch {
	case cmd.Context().Err() != nil && rep.RunID != 0:
		// Not wrapping context.Canceled: a stopped process must not exit 0. Its chunks are claimable again.
		return fmt.Errorf("stopped: left backfill run %d after applying %d chunks; the run's other workers take the rest", rep.RunID, rep.Chunks)
	case cmd.Context().Err() != nil:
		return errors.New("stopped while waiting for a backfill run to join")
	case err != nil && rep.RunID == 0:
		return err
	}
	fmt.Fprintf(stdout, "joined backfill run %d: applied %d chunks, %d rows (%d written, %d suppressed)\n",
		rep.RunID, rep.Chunks, rep.Rows, rep.Result.Applied, rep.Result.Suppressed)
	if err != nil {
		return err
	}
	if rep.Ended != "" {
		fmt.Fprintf(stdout, "  left it because %s\n", rep.Ended)
	}
	if !rep.Completed {
		return fmt.Errorf("backfill run %d did not complete: %s", rep.RunID, rep.Ended)
	}
	return nil
}

// printBackfillReport writes the summary of a completed run for people.
func printBackfillReport(w io.Writer, rep backfillrun.Report) {
	if rep.RunID == 0 {
		fmt.Fprintf(w, "nothing backfilled: every table was busy (%v)\n", rep.Skipped)
		return
	}
	fmt.Fprintf(w, "backfill run %d completed (this run's snapshot LSN %s)\n", rep.RunID, rep.Snapshot)
	for _, t := range rep.Tables {
		fmt.Fprintf(w, "  %s: %d rows, backfilled at %s\n", t.Table, t.Rows, t.BackfilledAt)
	}
	fmt.Fprintf(w, "  rows read:     %d (of which %d in chunks an interrupted run had started)\n", rep.Rows, rep.Reread)
	fmt.Fprintf(w, "  rows kept:     %d (applied by an interrupted run, not read again)\n", rep.Kept)
	if rep.Joined > 0 {
		fmt.Fprintf(w, "  rows joined:   %d (applied by workers of processes that joined the run)\n", rep.Joined)
	}
	fmt.Fprintf(w, "  applied:       %d (rows written: a snapshot row replaces an older version even when equal)\n", rep.Result.Applied)
	fmt.Fprintf(w, "  suppressed:    %d (the target already held that version or a newer one)\n", rep.Result.Suppressed)
	fmt.Fprintf(w, "  tombstoned:    %d (target rows the source no longer had)\n", rep.Tombstoned)
	if rep.Conflicts > 0 {
		fmt.Fprintf(w, "  conflicts:     %d (transactions that lost a deadlock or serialization conflict with a concurrent writer, retried)\n", rep.Conflicts)
	}
	if rep.Sequences != nil {
		fmt.Fprintln(w)
		printSequences(w, rep.Sequences)
	}
}
