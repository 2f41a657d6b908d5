package engine

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
)

// What SyncSequence did to a target sequence (SequenceLine.Action).
const (
	SequenceCreated   = apply.SequenceCreated
	SequenceAdvanced  = apply.SequenceAdvanced
	SequenceEqual     = apply.SequenceEqual
	SequenceKeptAhead = apply.SequenceKeptAhead
)

// SequenceLine is the outcome for one source sequence: the tables that use it, its source value,
// and what happened on the target (Err set when it failed).
type SequenceLine struct {
	Tables   []string
	Sequence string
	Source   *apply.SequenceValue
	apply.SequenceSync
	Err error
}

// syncSequences syncs the sequences the tables use (cdc.TableSequences) from src to tgt, each
// sequence once even when several tables use it, in name order. A table missing on the source is
// an error, or, when skipMissing is set, logged at WARN and skipped. It goes on after a failed
// sequence and returns every line with every error joined.
func syncSequences(ctx context.Context, src, tgt *pgx.Conn, tables []changebatch.TableName, skipMissing bool, log *slog.Logger) ([]SequenceLine, error) {
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
	var lines []SequenceLine
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
func syncSequence(ctx context.Context, src, tgt *pgx.Conn, n cdc.SequenceName) SequenceLine {
	l := SequenceLine{Sequence: n.String()}
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

// syncSequencesAt is syncSequences over new connections to the source and target URLs, for
// callers whose own connections are busy (the daemon's sessions and schedule).
func syncSequencesAt(ctx context.Context, sourceURL, targetURL string, tables []changebatch.TableName, log *slog.Logger) ([]SequenceLine, error) {
	src, tgt, err := connectBoth(ctx, sourceURL, targetURL)
	if err != nil {
		return nil, err
	}
	defer closeBoth(context.WithoutCancel(ctx), src, tgt)
	return syncSequences(ctx, src, tgt, tables, false, log)
}

// completedTables returns the names of the tables of rep that completed, in tables' order.
func completedTables(tables []changebatch.Table, rep BackfillReport) []changebatch.TableName {
	done := map[string]bool{}
	for _, r := range rep.Tables {
		done[r.Table] = true
	}
	var out []changebatch.TableName
	for _, t := range tables {
		if done[t.String()] {
			out = append(out, t.TableName)
		}
	}
	return out
}

// logSequenceSync syncs the sequences of the tables a daemon's backfill run completed and logs
// each outcome; a failure is logged at ERROR and does not stop the daemon (the data path does not
// depend on sequences), and the next completed backfill of the table tries again.
func logSequenceSync(ctx context.Context, cfg Config, tables []changebatch.Table, rep BackfillReport) {
	names := completedTables(tables, rep)
	if !cfg.SyncSequences || len(names) == 0 {
		return
	}
	lines, err := syncSequencesAt(ctx, cfg.Source, cfg.Target, names, cfg.Logger)
	for _, l := range lines {
		if l.Err == nil {
			cfg.Logger.Info("sequence synced", l.attrs()...)
		}
	}
	if err != nil && ctx.Err() == nil {
		cfg.Logger.Error("sequence sync after backfill failed: the target's sequences may be behind the source's", "run", rep.RunID, "err", err)
	}
}

// attrs returns the line as slog attributes.
func (l SequenceLine) attrs() []any {
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

// SequencesConfig configures SyncSequences (`pgconverge sequences`).
type SequencesConfig struct {
	Source, Target string
	// Tables are comma-separated lists of "schema.table" names (changebatch.ParseTableList); empty
	// means every table registered in the target's pgconverge.tables (apply.RegisteredTables).
	Tables []string
	Logger *slog.Logger
}

// Validate reports every problem of the configuration at once.
func (c *SequencesConfig) Validate() error {
	return errors.Join(validateURLs(c.Source, c.Target)...)
}

// SyncSequences sets the target's sequences past every value the source handed out, for the
// tables of cfg: one line per sequence, in name order. It goes on after a failed sequence and
// returns every line with every error joined; a source database other than the one the target's
// tables came from is refused (coverage.CheckTableSource).
func SyncSequences(ctx context.Context, cfg SequencesConfig) ([]SequenceLine, error) {
	src, tgt, err := connectBoth(ctx, cfg.Source, cfg.Target)
	if err != nil {
		return nil, err
	}
	defer closeBoth(context.WithoutCancel(ctx), src, tgt)
	if err := checkDistinct(ctx, src, tgt); err != nil {
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
	lines, err := syncSequences(ctx, src, tgt, names, len(cfg.Tables) == 0, cfg.Logger)
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
