package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/pgconverge/pgconverge/internal/sequences"
	"github.com/spf13/cobra"
)

func newSequencesCmd(stdout, stderr io.Writer) *cobra.Command {
	cfg := sequences.Config{}
	var logFormat, logLevel string
	cmd := &cobra.Command{
		Use:   "sequences --source URL --target URL [--table s.t ...]",
		Short: "Set the target's sequences past every value the source handed out (pgoutput does not carry sequences)",
		Long: `sequences finds the source sequences each table uses (owned by its serial or identity columns, or
named in a column default's nextval('...')), creates the missing ones on the target with the source's
parameters, and sets each so that the target's next nextval returns a value the source had not handed
out when it was read (its last_value, which counts values sessions cached and rolled-back nextval calls).
A target sequence already at or past the source's is never moved back (for a descending sequence, past
means lower). Values the source hands out after the read are not covered: run it after writes to the
source stopped, at cutover. Without --table it takes every table pgconverge replicates into the target.

Prints one line per sequence. Exit status: 0 when every sequence is synced, 1 otherwise (the error
names the sequence and the fix). URLs default to $PGCONVERGE_SOURCE and $PGCONVERGE_TARGET.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			if err := cfg.Validate(); err != nil {
				return err
			}
			lines, err := sequences.Sync(cmd.Context(), cfg)
			if lines != nil || err == nil {
				printSequences(stdout, lines)
			}
			return err
		},
	}
	f := cmd.Flags()
	addURLFlags(f, &cfg.Source, &cfg.Target)
	f.StringArrayVar(&cfg.Tables, "table", nil, "table whose sequences to sync as schema.table, repeated or comma-separated; unquoted names fold to lower case as in SQL (default: every table pgconverge replicates into the target)")
	addLogFlags(f, &logFormat, &logLevel)
	return cmd
}

// printSequences writes one line per sequence and a summary.
func printSequences(w io.Writer, lines []sequences.Line) {
	if len(lines) == 0 {
		fmt.Fprintln(w, "no sequences: the tables use none (owned by a column, or in a column default's nextval)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSEQUENCE\tSOURCE\tTARGET BEFORE\tTARGET AFTER\tACTION")
	count := map[string]int{}
	for _, l := range lines {
		after, action := l.After.String(), string(l.Action)
		if l.Err != nil {
			after, action = "-", "error (below)"
		}
		count[action]++
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", strings.Join(l.Tables, ","), l.Sequence, sequences.ValueText(l.Source), sequences.ValueText(l.Before), after, action)
	}
	tw.Flush()
	var parts []string
	for _, a := range []string{string(sequences.Created), string(sequences.Advanced), string(sequences.Equal), string(sequences.KeptAhead), "error (below)"} {
		if count[a] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", count[a], strings.TrimSuffix(a, " (below)")))
		}
	}
	noun := "sequences"
	if len(lines) == 1 {
		noun = "sequence"
	}
	fmt.Fprintf(w, "%d %s: %s\n", len(lines), noun, strings.Join(parts, ", "))
}
