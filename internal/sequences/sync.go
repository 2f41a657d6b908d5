// Package sequences sets a target's sequences past every value the source handed out, for the
// tables pgconverge follows: logical replication carries no sequence values (PostgreSQL docs,
// "Logical Replication", section Restrictions), so pgconverge reads each sequence the tables use on
// the source and advances the target's, never lowering it.
package sequences

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// What Sync did to a target sequence (Line.Action).
const (
	Created   = apply.SequenceCreated
	Advanced  = apply.SequenceAdvanced
	Equal     = apply.SequenceEqual
	KeptAhead = apply.SequenceKeptAhead
)

// Line is the outcome for one source sequence: the tables that use it, its source value,
// and what happened on the target (Err set when it failed).
type Line struct {
	Tables   []string
	Sequence string
	Source   *apply.SequenceValue
	apply.SequenceSync
	Err error
}

// syncTables syncs the sequences the tables use (cdc.TableSequences) from src to tgt, each
// sequence once even when several tables use it, in name order. A table missing on the source is
// an error, or, when skipMissing is set, logged at WARN and skipped. It goes on after a failed
// sequence and returns every line with every error joined.
func syncTables(ctx context.Context, src, tgt *pgx.Conn, tables []changebatch.TableName, skipMissing bool, log *slog.Logger) ([]Line, error) {
	if err := cdc.CheckSequenceSource(ctx, src); err != nil {
		return nil, err
	}
	var errs []error
	var order []cdc.SequenceName
	users := map[cdc.SequenceName][]string{}
	for _, t := range tables {
		seqs, err := cdc.TableSequences(ctx, src, t)
		if errors.Is(err, cdc.ErrNoSourceTable) && skipMissing {
			log.Warn("table not on the source any more: no sequences to sync", "table", t.String())
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, s := range seqs {
			if _, ok := users[s]; !ok {
				order = append(order, s)
			}
			users[s] = append(users[s], t.String())
		}
	}
	var lines []Line
	for _, n := range order {
		l := syncSequence(ctx, src, tgt, n)
		l.Tables = users[n]
		if l.Err != nil {
			errs = append(errs, l.Err)
		}
		lines = append(lines, l)
	}
	return lines, errors.Join(errs...)
}

// syncSequence reads sequence n on the source and syncs it to the target.
func syncSequence(ctx context.Context, src, tgt *pgx.Conn, n cdc.SequenceName) Line {
	l := Line{Sequence: n.String()}
	s, err := cdc.ReadSequence(ctx, src, n)
	if err != nil {
		l.Err = err
		return l
	}
	v := apply.SequenceValue{LastValue: s.LastValue, IsCalled: s.IsCalled}
	l.Source = &v
	l.SequenceSync, l.Err = apply.SyncSequence(ctx, tgt, apply.Sequence{
		Schema: s.Schema, Name: s.Name, DataType: s.DataType, Start: s.Start, Increment: s.Increment,
		Min: s.Min, Max: s.Max, Cache: s.Cache, Cycle: s.Cycle, Value: v,
	})
	return l
}

// SyncTables is syncTables over new connections to the source and target URLs, for
// callers whose own connections are busy (the daemon's sessions and schedule). When the source is
// a standby and primaryURL is set (--primary), the values are read on the primary, since a
// standby's lag the primary's.
func SyncTables(ctx context.Context, sourceURL, primaryURL, targetURL string, tables []changebatch.TableName, log *slog.Logger) ([]Line, error) {
	src, tgt, err := pgsession.ConnectBoth(ctx, sourceURL, targetURL)
	if err != nil {
		return nil, err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), src, tgt)
	if primaryURL != "" {
		standby, err := cdc.InRecovery(ctx, src)
		if err != nil {
			return nil, err
		}
		if standby {
			primary, err := pgsession.Connect(ctx, primaryURL, "primary")
			if err != nil {
				return nil, err
			}
			defer primary.Close(context.WithoutCancel(ctx))
			src = primary
		}
	}
	return syncTables(ctx, src, tgt, tables, false, log)
}

// Attrs returns the line as slog attributes: sequence, tables, source_value, target_before,
// target_after and action.
func (l Line) Attrs() []any {
	return []any{"sequence", l.Sequence, "tables", l.Tables, "source_value", ValueText(l.Source),
		"target_before", ValueText(l.Before), "target_after", l.After.String(), "action", string(l.Action)}
}

// ValueText prints a sequence value as `pgconverge sequences` shows it, "-" for none.
func ValueText(v *apply.SequenceValue) string {
	if v == nil {
		return "-"
	}
	return v.String()
}

// Config configures Sync (`pgconverge sequences`).
type Config struct {
	Source, Target string
	// Tables are comma-separated lists of "schema.table" names (changebatch.ParseTableList); empty
	// means every table registered in the target's pgconverge.tables (apply.RegisteredTables).
	Tables []string
	Logger *slog.Logger
}

// Validate reports every problem of the configuration at once.
func (c *Config) Validate() error {
	return errors.Join(pgsession.ValidateURLs(c.Source, c.Target)...)
}

// Sync sets the target's sequences past every value the source handed out, for the
// tables of cfg: one line per sequence, in name order. It goes on after a failed sequence and
// returns every line with every error joined; a source database other than the one the target's
// tables came from is refused (coverage.CheckTableSource).
func Sync(ctx context.Context, cfg Config) ([]Line, error) {
	src, tgt, err := pgsession.ConnectBoth(ctx, cfg.Source, cfg.Target)
	if err != nil {
		return nil, err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), src, tgt)
	if err := pgsession.CheckDistinct(ctx, src, tgt); err != nil {
		return nil, err
	}
	var names []changebatch.TableName
	if len(cfg.Tables) > 0 {
		if names, err = changebatch.ParseTableList(cfg.Tables); err != nil {
			return nil, fmt.Errorf("--table: %w", err)
		}
	} else {
		tables, err := apply.RegisteredTables(ctx, tgt)
		if err != nil {
			return nil, err
		}
		for _, t := range tables {
			names = append(names, t.TableName)
		}
	}
	if err := checkSequenceSource(ctx, src, tgt, names); err != nil {
		return nil, err
	}
	lines, err := syncTables(ctx, src, tgt, names, len(cfg.Tables) == 0, cfg.Logger)
	if err != nil {
		return lines, fmt.Errorf("sequences not synced: %w", err)
	}
	return lines, nil
}

// checkSequenceSource refuses a source database other than the one the target's tables were
// loaded or streamed from (coverage.CheckTableSource): its sequences are another database's.
func checkSequenceSource(ctx context.Context, src, tgt *pgx.Conn, names []changebatch.TableName) error {
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
