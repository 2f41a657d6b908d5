package main

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/pgconverge/pgconverge/internal/pacing"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/verify"
	"github.com/spf13/cobra"
)

// exitOpen is the exit status of `pgconverge verify` when discrepancies are left open.
const exitOpen = 4

func newVerifyCmd(stdout, stderr io.Writer) *cobra.Command {
	cfg := verify.Config{}
	var logFormat, logLevel, format string
	var schema bool
	var limits rateLimitFlags
	cmd := &cobra.Command{
		Use:   "verify --source URL --target URL [--table s.t ...] [--repair] [--incremental] [--schema [--ownership]] [--format table|json] [--no-values]",
		Short: "Compare the target with an exact snapshot of the source, record each discrepancy once, and repair it",
		Long: `verify reads the source at an exact snapshot S (a temporary logical slot's exported snapshot),
waits until the stream has applied the source up to S, and compares each table with the target by
checksums computed inside both databases, narrowed down to single keys. Target rows whose version is
newer than S are not compared: the stream has moved them on. It is safe to run while ` + "`pgconverge run`" + `
streams.

Each discrepancy (missing: the source has the row, the target has no live row; extra: the target
has a live row the source does not have; different: the values differ) is recorded in
pgconverge.discrepancies on the target under a deterministic id, so running verify again over the
same drift records nothing twice. Earlier discrepancies found equal now are closed. With --repair,
every open discrepancy's key is read again from a fresh exact snapshot S' and written through the
same version-guarded apply step at version (S', 0) (a tombstone where the source has no row), closing
the discrepancy in the same target transaction; a newer streamed change still wins.

With --schema, verify compares the tables' schemas instead of their rows: each table's columns and
types, NOT NULL, defaults, identities, constraints, indexes, triggers and comments on the target
against the source's, object by object, and prints each difference with the statements that fix
it. For a table pgconverge still replicates into, what cutover --finalize carries over (all but
the columns, types and non-unique indexes) is listed as pending, not as a difference.

--max-rows-per-second and --max-bytes-per-second limit what the comparison reads from the source:
each checksum query counts the table's rows as read, and waits afterwards until the limits allow
them; a SIGHUP reloads them from --config.

Exit status: 0 when no discrepancy is left open (with --schema: no difference), 4 when some are, 1
on an error (also when a table named with --table could not be compared). URLs default to $PGCONVERGE_SOURCE and $PGCONVERGE_TARGET.
The JSON format is documented in docs/verify.md and stays stable.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			if err := errors.Join(cfg.Validate(), validateFormat(format), validateSchemaFlags(schema, cfg)); err != nil {
				return err
			}
			if schema {
				return verifySchema(cmd, cfg, format, stdout)
			}
			cfg.Pacer = pacing.New(limits.limits(), nil)
			reloadLimitsOnHangup(cmd.Context(), cmd, logger, setPacerLimits(cfg.Pacer))
			rep, err := verify.Run(cmd.Context(), cfg)
			err = writeVerifyReport(stdout, format, rep, err, printVerify)
			switch {
			case err != nil:
				return err
			case rep.Open > 0:
				return exitError{Code: exitOpen, Err: fmt.Errorf("%d discrepancies are open (pgconverge.discrepancies on the target; verify --repair repairs them)", rep.Open)}
			}
			return nil
		},
	}
	f := cmd.Flags()
	addURLFlags(f, &cfg.Source, &cfg.Target)
	addPrimaryFlag(f, &cfg.Primary)
	f.StringArrayVar(&cfg.Tables, "table", nil, "table to verify, schema.table (repeat it or separate with commas; default: every table replicated into the target)")
	f.BoolVar(&schema, "schema", false, "compare the tables' schemas (columns, constraints, indexes, triggers, ...) instead of their rows")
	f.BoolVar(&cfg.Ownership, "ownership", false, "with --schema, compare the tables' owners and grants too (the roles must exist on the target)")
	f.BoolVar(&cfg.Repair, "repair", false, "rewrite every open discrepancy's key from a fresh exact snapshot of the source")
	f.BoolVar(&cfg.NoValues, "no-values", false, "record hashes only, never the rows' values")
	f.BoolVar(&cfg.Incremental, "incremental", false, "skip the key-hash groups unchanged since the last verify found them equal (pays on tables that mostly stand still; with any change since, slower than the default full verify)")
	f.StringVar(&format, "format", "table", "output format: table or json")
	addRateLimitFlags(f, &limits, "the comparison")
	f.DurationVar(&cfg.Wait, "wait", 0, "how long to wait for the stream to apply the source up to the snapshot (default 2m)")
	addAuditRetentionFlag(f, &cfg.AuditRetention)
	addLogFlags(f, &logFormat, &logLevel)
	return cmd
}

// writeVerifyReport writes a verify report as JSON or, for a terminal, with print, when err is nil
// or says that some tables could not be compared (verify.ErrNotVerified); it returns err, or the
// JSON encoding's error.
func writeVerifyReport[R any](w io.Writer, format string, rep R, err error, print func(io.Writer, R)) error {
	if err != nil && !errors.Is(err, verify.ErrNotVerified) {
		return err
	}
	if format != "json" {
		print(w, rep)
		return err
	}
	if encErr := writeJSON(w, rep); encErr != nil && err == nil {
		return encErr
	}
	return err
}

// validateSchemaFlags refuses the flags of a row comparison with --schema.
func validateSchemaFlags(schema bool, cfg verify.Config) error {
	if schema && (cfg.Repair || cfg.Incremental) {
		return errors.New("--schema compares schemas and repairs nothing: leave out --repair and --incremental (its differences name the statements that fix them)")
	}
	if cfg.Ownership && !schema {
		return errors.New("--ownership is a part of --schema's comparison: add --schema")
	}
	return nil
}

// verifySchema runs verify --schema and prints its report; it exits 4 on a difference.
func verifySchema(cmd *cobra.Command, cfg verify.Config, format string, stdout io.Writer) error {
	rep, err := verify.Schema(cmd.Context(), cfg)
	err = writeVerifyReport(stdout, format, rep, err, printSchema)
	switch {
	case err != nil:
		return err
	case rep.Differences > 0:
		return exitError{Code: exitOpen, Err: fmt.Errorf("%d schema differences (each printed with its fix)", rep.Differences)}
	}
	return nil
}

// printSchema writes verify --schema's report for a terminal: one line per table, then each
// difference with its fix.
func printSchema(w io.Writer, rep verify.SchemaReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSTATE\tDIFFERENCES\tPENDING")
	for _, t := range rep.Tables {
		pending := 0
		for _, d := range t.Differences {
			if d.Pending {
				pending++
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", t.Table, t.State, len(t.Differences)-pending, pending)
	}
	tw.Flush()
	for _, t := range rep.Tables {
		if t.Error != "" {
			fmt.Fprintf(w, "%s: %s\n", t.Table, t.Error)
		}
		for _, d := range t.Differences {
			what := "differs"
			switch {
			case d.Pending:
				what = "pending finalize"
			case d.TargetOnly:
				what = "only on the target"
			case d.Target == "":
				what = "missing on the target"
			}
			fmt.Fprintf(w, "%s: %s %s %s\n  source: %s\n  target: %s\n", t.Table, d.Kind, d.Object, what, orNone(d.Source), orNone(d.Target))
			for _, f := range d.Fix {
				fmt.Fprintf(w, "  fix: %s;\n", f)
			}
		}
	}
	fmt.Fprintf(w, "differences %d, pending finalize %d\n", rep.Differences, rep.Pending)
}

// orNone returns s, or "-" when it is empty.
func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printVerify writes the report for a terminal: one line per table, then the totals.
func printVerify(w io.Writer, rep verify.Report) {
	fmt.Fprintf(w, "verify run %d at snapshot %s (hash %s)", rep.RunID, rep.Snapshot, rep.HashMode)
	if rep.RepairSnapshot != "" {
		fmt.Fprintf(w, ", repaired at %s", rep.RepairSnapshot)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSTATE\tROWS COMPARED\tMOVED ON\tRANGES\tUNCHANGED\tROWS FETCHED\tBYTES FETCHED\tELAPSED\tFOUND\tREPAIRED\tOPEN")
	for _, t := range rep.Tables {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%.2fs\t%s\t%d\t%d\n", t.Table, t.State, t.RowsCompared, t.MovedOn, t.RangesChecked, t.GroupsSkipped,
			t.RowsFetched, coverage.HumanBytes(uint64(t.BytesFetched)), t.ElapsedSeconds, kinds(t.Found), t.Repaired, t.Open)
	}
	tw.Flush()
	for _, t := range rep.Tables {
		if t.Reason != "" {
			fmt.Fprintf(w, "%s: %s\n", t.Table, t.Reason)
		}
	}
	fmt.Fprintf(w, "found %d, repaired %d, open %d\n", rep.Found, rep.Repaired, rep.Open)
}

// kinds prints counts by kind, for example "missing 2, different 1", or "-".
func kinds(m map[string]int64) string {
	var parts []string
	for k, n := range m {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
