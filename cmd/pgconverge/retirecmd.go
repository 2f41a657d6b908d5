package main

import (
	"fmt"
	"io"
	"os"

	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/spf13/cobra"
)

func newRetireCmd(stdout io.Writer) *cobra.Command {
	cfg := operator.RetireConfig{}
	cmd := &cobra.Command{
		Use:   "retire --target URL --table s.t [--table ...]",
		Short: "Record that tables no stream follows any more are not to be followed, so coverage stops reporting them",
		Long: `retire records in the target's ledger that no stream is to follow the tables any more. A table that a
daemon followed and no longer does (it was left out of --tables, or left the publication) is reported
not-streamed by coverage, which fails --fail-on-gap: its target copy stopped following the source at
its watermark, and nothing else says whether that is meant. Once retired, it is reported retired,
with the time, and passes. A table a stream still follows is refused (start pgconverge run without it
first), and so is one the ledger does not know; then nothing is retired. A run that selects a retired
table again follows it again and loads it from a new snapshot. The target tables are left as they are.

Prints one line per table retired. Exit status: 0 when every table is retired (now or before), 1
otherwise. The URL defaults to $PGCONVERGE_TARGET.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			retired, err := operator.Retire(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			for _, t := range retired {
				fmt.Fprintf(stdout, "retired %s\n", t)
			}
			if len(retired) == 0 {
				fmt.Fprintln(stdout, "every table was retired already")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Target, "target", os.Getenv("PGCONVERGE_TARGET"), "target PostgreSQL URL ($PGCONVERGE_TARGET)")
	f.StringArrayVar(&cfg.Tables, "table", nil, "table to retire as schema.table, repeated or comma-separated; unquoted names fold to lower case as in SQL")
	return cmd
}
