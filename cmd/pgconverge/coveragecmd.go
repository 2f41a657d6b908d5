package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/spf13/cobra"
)

// exitGap is the exit status of `pgconverge coverage --fail-on-gap` when a table has a gap.
const exitGap = 3

// exitError makes the process exit with Code after printing Err.
type exitError struct {
	Code int
	Err  error
}

func (e exitError) Error() string { return e.Err.Error() }
func (e exitError) Unwrap() error { return e.Err }

// coverageConfig configures `pgconverge coverage`.
type coverageConfig struct {
	Source, Target, Slot, Format string
	FailOnGap                    bool
}

// Validate reports every problem of the configuration at once.
func (c *coverageConfig) Validate() error {
	errs := validateURLs(c.Source, c.Target)
	if err := cdc.ValidateSlotName(c.Slot); err != nil {
		errs = append(errs, err)
	}
	if c.Format != "table" && c.Format != "json" {
		errs = append(errs, fmt.Errorf("--format %q is invalid: use table or json", c.Format))
	}
	return errors.Join(errs...)
}

func newCoverageCmd(stdout io.Writer) *cobra.Command {
	cfg := coverageConfig{}
	cmd := &cobra.Command{
		Use:   "coverage --source URL --target URL [--format table|json] [--fail-on-gap]",
		Short: "Report, per table, which LSN ranges no backfill and no stream delivered (coverage gaps)",
		Long: `coverage reads the coverage ledger in the target (pgconverge schema) and the source's slots and
publication, and reports per table: its status (covered, gap, loading, never-loaded, or not-streamed
for a table no stream follows any more), the LSN of its last completed backfill, where its continuous
stream coverage starts, its watermark and lag in bytes, and each gap as an LSN range [from, to) with
its size in bytes and the key ranges it misses. It also reports each slot's health: wal_status,
safe_wal_size, restart_lsn lag, and a warning when the slot is lost, missing or at risk of losing WAL
(max_slot_wal_keep_size). A lost or missing slot makes everything after the watermark a gap at once.

Exit status: 0 when the report was made (and, with --fail-on-gap, no table has a gap), 3 with
--fail-on-gap when some table has a gap, 1 on an error. URLs default to $PGCONVERGE_SOURCE and
$PGCONVERGE_TARGET. The JSON format is documented in README.md and stays stable.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			rep, err := buildCoverage(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if cfg.Format == "json" {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
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
	f.StringVar(&cfg.Format, "format", "table", "output format: table or json")
	f.BoolVar(&cfg.FailOnGap, "fail-on-gap", false, "exit with status 3 when a table has a coverage gap")
	return cmd
}

func buildCoverage(ctx context.Context, cfg coverageConfig) (coverage.Report, error) {
	src, err := pgsession.Connect(ctx, cfg.Source, "source")
	if err != nil {
		return coverage.Report{}, err
	}
	defer src.Close(context.WithoutCancel(ctx))
	tgt, err := pgsession.Connect(ctx, cfg.Target, "target")
	if err != nil {
		return coverage.Report{}, err
	}
	defer tgt.Close(context.WithoutCancel(ctx))
	return coverage.Build(ctx, src, tgt, coverage.Options{Slot: cfg.Slot})
}

func uncovered(rep coverage.Report) []string {
	var out []string
	for _, t := range rep.Tables {
		if t.Status != coverage.Covered && t.Status != coverage.NotStreamed {
			out = append(out, t.Table+" ("+string(t.Status)+")")
		}
	}
	return out
}

// printCoverage writes the report for a terminal: the slots, one line per table, its gaps below it.
func printCoverage(w io.Writer, rep coverage.Report) {
	fmt.Fprintf(w, "source at %s\n", rep.SourceLSN)
	for _, s := range rep.Slots {
		if !s.Exists {
			fmt.Fprintf(w, "slot %s: missing\n", s.Name)
		} else {
			safe := "unlimited"
			if s.SafeWALSizeBytes != nil {
				safe = size(uint64(max(*s.SafeWALSizeBytes, 0)))
			}
			active := "inactive (no daemon streams from it)"
			if s.Active {
				active = "active"
			}
			fmt.Fprintf(w, "slot %s: wal_status %s, safe_wal_size %s, restart_lsn lag %s, %s\n", s.Name, s.WALStatus, safe, size(s.RestartLagBytes), active)
		}
		if s.Warning != "" {
			fmt.Fprintf(w, "WARNING: %s\n", s.Warning)
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSTATUS\tBACKFILLED AT\tSTREAMED SINCE\tWATERMARK\tLAG\tGAPS")
	for _, t := range rep.Tables {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Table, t.Status, lsnOr(t.BackfillLSN), lsnOr(t.StreamStartLSN),
			t.WatermarkLSN, size(t.LagBytes), gapSummary(t))
		for _, g := range t.Gaps {
			fmt.Fprintf(tw, "  gap [%s, %s)\t\t\t\t\t\t%s, %s\n", g.FromLSN, g.ToLSN, size(g.Bytes), keysText(g.Keys))
		}
	}
	tw.Flush()
	for _, t := range rep.Tables {
		if t.Note != "" && t.Status != coverage.Covered {
			fmt.Fprintf(w, "%s: %s\n", t.Table, t.Note)
		}
	}
	if rep.Covered {
		fmt.Fprintln(w, "\nevery streamed table is covered up to its watermark")
	} else {
		fmt.Fprintf(w, "\ncoverage gap in %s: with run --on-gap=backfill (the default) the daemon backfills them when it (re)starts; or run pgconverge backfill --table for each\n",
			strings.Join(uncovered(rep), ", "))
	}
}

func gapSummary(t coverage.TableReport) string {
	if len(t.Gaps) == 0 {
		return "-"
	}
	return fmt.Sprintf("%d (%s)", len(t.Gaps), size(t.GapBytes))
}

func keysText(keys []coverage.KeyRange) string {
	if keys == nil {
		return "all keys"
	}
	parts := make([]string, len(keys))
	bound := func(k []string, inf string) string {
		if k == nil {
			return inf
		}
		return strings.Join(k, ",")
	}
	for i, k := range keys {
		parts[i] = "(" + bound(k.Lower, "-inf") + ", " + bound(k.Upper, "+inf") + "]"
	}
	return "keys " + strings.Join(parts, " ")
}

func lsnOr(l *coverage.LSN) string {
	if l == nil {
		return "-"
	}
	return l.String()
}

// size prints bytes exactly, with a binary-unit rounding for large values.
func size(b uint64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	if b < 1024 {
		return fmt.Sprintf("%d B", b)
	}
	v, u := float64(b)/1024, 0
	for v >= 1024 && u < len(units)-1 {
		v, u = v/1024, u+1
	}
	return fmt.Sprintf("%d B (%.1f %s)", b, v, units[u])
}
