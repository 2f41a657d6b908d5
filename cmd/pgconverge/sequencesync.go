package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// sequenceLine is the outcome for one source sequence: the tables that use it, its source value,
// and what happened on the target (Err set when it failed).
type sequenceLine struct {
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
func syncSequences(ctx context.Context, src, tgt *pgx.Conn, tables []cdc.TableName, skipMissing bool, log *slog.Logger) ([]sequenceLine, error) {
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
	var lines []sequenceLine
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
func syncSequence(ctx context.Context, src, tgt *pgx.Conn, n cdc.SequenceName) sequenceLine {
	l := sequenceLine{Sequence: n.String()}
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
func syncSequencesAt(ctx context.Context, sourceURL, targetURL string, tables []cdc.TableName, log *slog.Logger) ([]sequenceLine, error) {
	src, err := pgsession.Connect(ctx, sourceURL, "source")
	if err != nil {
		return nil, err
	}
	defer src.Close(context.WithoutCancel(ctx))
	tgt, err := pgsession.Connect(ctx, targetURL, "target")
	if err != nil {
		return nil, err
	}
	defer tgt.Close(context.WithoutCancel(ctx))
	return syncSequences(ctx, src, tgt, tables, false, log)
}

// completedTables returns the names of the tables of rep that completed, in tables' order.
func completedTables(tables []changebatch.Table, rep backfillReport) []cdc.TableName {
	done := map[string]bool{}
	for _, r := range rep.Tables {
		done[r.Table] = true
	}
	var out []cdc.TableName
	for _, t := range tables {
		if done[t.String()] {
			out = append(out, cdc.TableName{Schema: t.Schema, Name: t.Name})
		}
	}
	return out
}

// logSequenceSync syncs the sequences of the tables a daemon's backfill run completed and logs
// each outcome; a failure is logged at ERROR and does not stop the daemon (the data path does not
// depend on sequences), and the next completed backfill of the table tries again.
func logSequenceSync(ctx context.Context, cfg daemonConfig, tables []changebatch.Table, rep backfillReport) {
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
func (l sequenceLine) attrs() []any {
	return []any{"sequence", l.Sequence, "tables", l.Tables, "source_value", valueText(l.Source),
		"target_before", valueText(l.Before), "target_after", l.After.String(), "action", string(l.Action)}
}

// valueText prints a value, "-" for none.
func valueText(v *apply.SequenceValue) string {
	if v == nil {
		return "-"
	}
	return v.String()
}

// printSequences writes one line per sequence and a summary.
func printSequences(w io.Writer, lines []sequenceLine) {
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", strings.Join(l.Tables, ","), l.Sequence, valueText(l.Source), valueText(l.Before), after, action)
	}
	tw.Flush()
	var parts []string
	for _, a := range []string{string(apply.SequenceCreated), string(apply.SequenceAdvanced), string(apply.SequenceEqual), string(apply.SequenceKeptAhead), "error (below)"} {
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
