package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/spf13/cobra"
)

// sequencesConfig configures `pgconverge sequences`.
type sequencesConfig struct {
	Source, Target string
	// Tables are comma-separated lists of "schema.table" names (changebatch.SplitTableList); empty
	// means every table registered in the target's pgconverge.tables (apply.RegisteredTables).
	Tables []string
	Logger *slog.Logger
}

// Validate reports every problem of the configuration at once.
func (c *sequencesConfig) Validate() error {
	return errors.Join(validateURLs(c.Source, c.Target)...)
}

func newSequencesCmd(stdout, stderr io.Writer) *cobra.Command {
	cfg := sequencesConfig{}
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
			lines, err := runSequencesCmd(cmd.Context(), cfg)
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

// runSequencesCmd resolves the tables and syncs their sequences (syncSequences).
func runSequencesCmd(ctx context.Context, cfg sequencesConfig) ([]sequenceLine, error) {
	src, err := pgsession.Connect(ctx, cfg.Source, "source")
	if err != nil {
		return nil, err
	}
	defer src.Close(context.WithoutCancel(ctx))
	tgt, err := pgsession.Connect(ctx, cfg.Target, "target")
	if err != nil {
		return nil, err
	}
	defer tgt.Close(context.WithoutCancel(ctx))
	if err := checkDistinct(ctx, src, tgt); err != nil {
		return nil, err
	}
	var names []cdc.TableName
	if len(cfg.Tables) > 0 {
		var errs []error
		for _, list := range cfg.Tables {
			for _, n := range changebatch.SplitTableList(list) {
				schema, name, err := changebatch.ParseTableName(n)
				if err != nil {
					errs = append(errs, fmt.Errorf("--table: %w", err))
					continue
				}
				names = append(names, cdc.TableName{Schema: schema, Name: name})
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
	} else {
		tables, err := apply.RegisteredTables(ctx, tgt)
		if err != nil {
			return nil, err
		}
		for _, t := range tables {
			names = append(names, cdc.TableName{Schema: t.Schema, Name: t.Name})
		}
	}
	if err := checkSequenceSource(ctx, src, tgt, names); err != nil {
		return nil, err
	}
	lines, err := syncSequences(ctx, src, tgt, names, len(cfg.Tables) == 0, cfg.Logger)
	if err != nil {
		return lines, fmt.Errorf("sequences not synced: %w", err)
	}
	return lines, nil
}

// checkSequenceSource refuses a source database other than the one the target's tables were
// loaded or streamed from (coverage.CheckTableSource): its sequences are another database's.
func checkSequenceSource(ctx context.Context, src, tgt *pgx.Conn, names []cdc.TableName) error {
	known, err := apply.HasMetadata(ctx, tgt)
	if err != nil || !known {
		return err
	}
	id, err := cdc.SourceID(ctx, src)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := coverage.CheckTableSource(ctx, tgt, n, id); err != nil {
			return err
		}
	}
	return nil
}
