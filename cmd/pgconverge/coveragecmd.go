package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/spf13/cobra"
)

// exitGap is the exit status of `pgconverge coverage --fail-on-gap` when a table has a gap.
const exitGap = 3

// exitError makes the process exit with Code after printing Err.
type exitError struct {
	Code int
	Err  error
}

// Error returns the wrapped error's message.
func (e exitError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e exitError) Unwrap() error { return e.Err }

// coverageConfig configures `pgconverge coverage`: the report's inputs, and how to print it.
type coverageConfig struct {
	operator.CoverageConfig
	Format    string
	FailOnGap bool
}

// Validate reports every problem of the configuration at once.
func (c *coverageConfig) Validate() error {
	return errors.Join(c.CoverageConfig.Validate(), validateFormat(c.Format))
}

func newCoverageCmd(stdout io.Writer) *cobra.Command {
	cfg := coverageConfig{}
	cmd := &cobra.Command{
		Use:   "coverage --source URL --target URL [--format table|json] [--fail-on-gap]",
		Short: "Report, per table, which LSN ranges no backfill and no stream delivered (coverage gaps)",
		Long: `coverage reads the coverage ledger in the target (pgconverge schema) and the source's slots and
publication, and reports per table: its status (covered, gap, loading, never-loaded, schema-changed,
not-streamed for a table no stream follows any more, retired for one retired on purpose (pgconverge
retire), or snapshot-only for a table no publication can carry, kept by backfills: as of its last
backfill's snapshot, with its age), the LSN of its last
completed backfill, where its continuous
stream coverage starts, its watermark and lag in bytes, and each gap as an LSN range [from, to) with
its size in bytes and the key ranges it misses. It also reports each slot's health: wal_status,
safe_wal_size, restart_lsn lag, and a warning when the slot is lost, missing or at risk of losing WAL
(max_slot_wal_keep_size). A lost or missing slot makes everything after the watermark a gap at once.
On PostgreSQL 17 and later each slot also shows whether a promoted standby could continue it
(failover slots: docs/high-availability.md); --standby URL checks a standby's copy on the standby.

Exit status: 0 when the report was made (and, with --fail-on-gap, every table is covered,
snapshot-only or retired), 3 with --fail-on-gap when a table is gap, loading, never-loaded,
schema-changed or not-streamed, 1 on an error (also
when the source URL is not the database the ledger's stream reads). URLs default to $PGCONVERGE_SOURCE and
$PGCONVERGE_TARGET. The JSON format is documented in docs/coverage.md and stays stable.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			rep, err := operator.CoverageReport(cmd.Context(), cfg.CoverageConfig)
			if err != nil {
				return err
			}
			if cfg.Format == "json" {
				if err := writeJSON(stdout, rep); err != nil {
					return err
				}
			} else {
				printCoverage(stdout, rep)
			}
			if cfg.FailOnGap && !rep.Covered {
				return exitError{Code: exitGap, Err: fmt.Errorf("coverage gap in %s", strings.Join(uncovered(rep), ", "))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	addURLFlags(f, &cfg.Source, &cfg.Target)
	f.StringVar(&cfg.Slot, "slot", "pgconverge", "slot to describe when no stream follows any table yet (streamed tables name their own)")
	addStandbyFlag(f, &cfg.Standbys)
	f.StringVar(&cfg.Format, "format", "table", "output format: table or json")
	f.BoolVar(&cfg.FailOnGap, "fail-on-gap", false, "exit with status 3 when a table has a coverage gap")
	return cmd
}

func uncovered(rep coverage.Report) []string {
	var out []string
	for _, t := range rep.Tables {
		if t.Status.Failing() {
			out = append(out, t.Table+" ("+string(t.Status)+")")
		}
	}
	return out
}

// invalidationReason is ", invalidation_reason R" when the source says why it invalidated slot
// s, else "".
func invalidationReason(s coverage.SlotHealth) string {
	if s.InvalidationReason == "" {
		return ""
	}
	return ", invalidation_reason " + s.InvalidationReason
}

// printFailover writes a slot's failover readiness (nil: none, the source predates PostgreSQL
// 17): what the primary shows, then each standby checked, then the warnings.
func printFailover(w io.Writer, r *coverage.FailoverReadiness) {
	if r == nil {
		return
	}
	if !r.Enabled {
		fmt.Fprintln(w, "  failover: off (not a failover slot)")
	} else {
		sync := "synchronized_standby_slots unset"
		if len(r.SynchronizedStandbySlots) > 0 {
			sync = "synchronized_standby_slots " + strings.Join(r.SynchronizedStandbySlots, ", ")
		}
		fmt.Fprintf(w, "  failover: on, %s, %d physical slot(s)\n", sync, len(r.PhysicalSlots))
	}
	for _, p := range r.PhysicalSlots {
		state := "inactive"
		if p.Active {
			state = "active"
		}
		fmt.Fprintf(w, "    physical slot %s: %s, in synchronized_standby_slots: %s, holds an xmin (hot_standby_feedback seen): %s\n", p.Name, state, yesNo(p.Synchronized), yesNo(p.Feedback))
	}
	for _, c := range r.StandbyChecks {
		switch {
		case c.Error != "":
			fmt.Fprintf(w, "    standby %s: not checked (the warning below says why)\n", c.Standby)
		case c.Ready:
			fmt.Fprintf(w, "    standby %s: ready for failover (synced, confirmed_flush_lsn %s)\n", c.Standby, lsnOr(c.ConfirmedFlushLSN))
		default:
			why := fmt.Sprintf("in recovery %v, has the slot %v, synced %v, temporary %v", c.InRecovery, c.Exists, c.Synced, c.Temporary)
			if c.InvalidationReason != "" {
				why += ", invalidation_reason " + c.InvalidationReason
			}
			fmt.Fprintf(w, "    standby %s: NOT ready (%s)\n", c.Standby, why)
		}
	}
	if len(r.StandbyChecks) == 0 {
		fmt.Fprintln(w, "    no standby checked: pass --standby URL to check the slot's copy on a standby (PostgreSQL docs §29.3)")
	}
	for _, m := range r.Warnings {
		fmt.Fprintf(w, "WARNING: %s\n", m)
	}
}

// yesNo is "yes" or "no".
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// printCoverage writes the report for a terminal: the slots, one line per table, then the gaps
// and notes.
func printCoverage(w io.Writer, rep coverage.Report) {
	fmt.Fprintf(w, "source at %s\n", rep.SourceLSN)
	for _, s := range rep.Slots {
		switch {
		case !s.Exists:
			fmt.Fprintf(w, "slot %s: missing\n", s.Name)
		case s.Invalidated():
			fmt.Fprintf(w, "slot %s: invalidated (wal_status %s%s)\n", s.Name, s.WALStatus, invalidationReason(s))
		default:
			safe := "unlimited"
			if s.SafeWALSizeBytes != nil {
				safe = coverage.HumanBytes(uint64(max(*s.SafeWALSizeBytes, 0)))
			}
			active := "no walsender streams from it now (the daemon is stopped, loading or reconnecting)"
			if s.Active {
				active = "streaming"
			}
			fmt.Fprintf(w, "slot %s: wal_status %s, safe_wal_size %s, holds %s of WAL, %s\n", s.Name, s.WALStatus, safe, coverage.HumanBytes(s.RestartLagBytes), active)
		}
		if s.Warning != "" {
			fmt.Fprintf(w, "WARNING: %s\n", s.Warning)
		}
		printFailover(w, s.Failover)
	}
	printWaits(w, rep.Waiting)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSTATUS\tBACKFILLED AT\tSTREAMED SINCE\tWATERMARK\tLAG\tGAPS")
	for _, t := range rep.Tables {
		gaps := "-"
		if len(t.Gaps) > 0 {
			gaps = fmt.Sprintf("%d, %s", len(t.Gaps), coverage.HumanBytes(t.GapBytes))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Table, t.Status, lsnOr(t.BackfillLSN), lsnOr(t.StreamStartLSN),
			t.WatermarkLSN, coverage.HumanBytes(t.LagBytes), gaps)
	}
	tw.Flush()
	var gapLines, notes []string
	for _, t := range rep.Tables {
		for _, g := range t.Gaps {
			gapLines = append(gapLines, fmt.Sprintf("  %s [%s, %s) %d bytes (%s), %s", t.Table, g.FromLSN, g.ToLSN, g.Bytes, coverage.HumanBytes(g.Bytes), keysText(g.Keys)))
		}
		if t.Note != "" && (t.Status != coverage.Covered || stopped(t) || t.RowFilter != "" || t.ColumnList != nil) {
			notes = append(notes, fmt.Sprintf("  %s: %s", t.Table, t.Note))
		}
	}
	if len(gapLines) > 0 {
		fmt.Fprintln(w, "\ngaps (LSN ranges no backfill and no stream delivered):")
		fmt.Fprintln(w, strings.Join(gapLines, "\n"))
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nnotes:")
		fmt.Fprintln(w, strings.Join(notes, "\n"))
	}
	var halted []string
	for _, t := range rep.Tables {
		if stopped(t) {
			halted = append(halted, t.Table)
		}
	}
	switch {
	case rep.Covered && len(halted) > 0:
		fmt.Fprintf(w, "\nevery streamed table is covered up to its watermark, but stopped: no daemon follows %s now, so the watermark does not move (start pgconverge run)\n", strings.Join(halted, ", "))
	case rep.Covered:
		fmt.Fprintln(w, "\nevery streamed table is covered up to its watermark")
	default:
		fmt.Fprintf(w, "\nnot covered: %s\n", strings.Join(uncovered(rep), ", "))
		fmt.Fprintln(w, "pgconverge run backfills never-loaded tables and, with --on-gap=backfill (the default), gaps when a session starts; loading tables are being backfilled now; or run pgconverge backfill --table for each")
	}
}

// printWaits writes one line per table a running daemon leaves to the running daemon of another
// slot and waits for.
func printWaits(w io.Writer, waits []coverage.Wait) {
	for _, x := range waits {
		fmt.Fprintf(w, "slot %s waits for table %s: followed by the running daemon of slot %s (since %s); take the table out of one daemon's selection, or stop the other daemon (this one then takes it over)\n",
			x.Slot, x.Table, x.FollowedBy, x.Since.Local().Format(time.DateTime))
	}
}

// stopped reports whether t is streamed but no daemon follows it now (its slot has no walsender).
func stopped(t coverage.TableReport) bool {
	return t.Status != coverage.NotStreamed && t.Status != coverage.SnapshotOnly && t.Status != coverage.Retired && t.Slot != "" && !t.Following
}

func keysText(keys []coverage.KeyRange) string {
	if keys == nil {
		return "all keys"
	}
	if keys[0].Blocks {
		return "the rows of " + coverage.FormatKeyRanges(keys)
	}
	return "keys " + coverage.FormatKeyRanges(keys)
}

func lsnOr(l *coverage.LSN) string {
	if l == nil {
		return "-"
	}
	return l.String()
}
