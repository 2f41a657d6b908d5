package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// unknownQueue is how many batches of keys with unknown values wait for fillUnknown; more are
// left to verify --repair, with an ERROR saying so.
const unknownQueue = 64

// unknownKeys are keys of one table whose target rows the stream left with unknown values
// (apply.Result.Unknown).
type unknownKeys struct {
	table changebatch.Table
	keys  [][]string
}

// noteUnknown hands the keys a committed stream transaction left with unknown values to
// fillUnknown without waiting; when its queue is full they are logged at ERROR with the fix.
func (s *session) noteUnknown(byTable map[string][][]string) {
	for name, keys := range byTable {
		t, ok := s.tableNamed(name)
		if !ok {
			continue
		}
		select {
		case s.unknown <- unknownKeys{table: t, keys: keys}:
		default:
			s.cfg.Logger.Error("target rows lack values the source left out as unchanged TOAST, and too many wait to be filled: run pgconverge verify --repair --table "+name,
				"table", name, "rows", len(keys))
		}
	}
}

// tableNamed returns the session's description of the table whose String is name.
func (s *session) tableNamed(name string) (changebatch.Table, bool) {
	for _, t := range s.tables {
		if t.String() == name {
			return t, true
		}
	}
	return changebatch.Table{}, false
}

// fillUnknown fills, while the session streams, the values the stream could not know: for each
// batch of keys it reads those rows from a fresh exact snapshot S' of the source (through the
// table's row filter) and writes them through the apply step at (S', 0), or a tombstone where S'
// has no row, in one target transaction. S' follows the commit that left them unknown, so the
// snapshot's rows are newer; a change streamed after S' still wins by the version rule. A failure
// is logged at ERROR with the fix (verify --repair) and never ends the session. It returns nil
// when ctx ends.
func (s *session) fillUnknown(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case u := <-s.unknown:
			for _, u := range drainUnknown(u, s.unknown) {
				s.filling.Add(1) // before the fill's snapshot: pruneRound waits for it (pruneTombstones)
				filled, at, err := fillKeys(ctx, s.cfg.Source, s.cfg.Target, s.cfg.copyOnly, u)
				s.filling.Add(-1)
				switch {
				case ctx.Err() != nil:
					return nil
				case err != nil:
					s.cfg.Logger.Error("could not fill target values the source left out as unchanged TOAST: run pgconverge verify --repair --table "+u.table.String(),
						"table", u.table.String(), "rows", len(u.keys), "err", err)
				default:
					s.cfg.Logger.Info("filled target values the source left out as unchanged TOAST, from a fresh snapshot",
						"table", u.table.String(), "rows", filled, "snapshot_lsn", at)
				}
			}
		}
	}
}

// drainUnknown returns first and whatever else waits in queue, merged per table, so one snapshot
// serves every key that waited.
func drainUnknown(first unknownKeys, queue chan unknownKeys) []unknownKeys {
	out := []unknownKeys{first}
	for {
		select {
		case u := <-queue:
			i := slices.IndexFunc(out, func(o unknownKeys) bool { return o.table.TableName == u.table.TableName })
			if i < 0 {
				out = append(out, u)
			} else {
				out[i].keys = append(out[i].keys, u.keys...)
			}
		default:
			return out
		}
	}
}

// fillKeys rewrites u's keys from a fresh exact snapshot in one target transaction and returns
// the rows written and the snapshot's LSN; copyOnly is the daemon's (apply.New).
func fillKeys(ctx context.Context, source, target string, copyOnly *apply.CopyOnlyTables, u unknownKeys) (int64, string, error) {
	u.keys = distinctKeys(u.keys)
	exp, err := backfill.Export(ctx, source)
	if err != nil {
		return 0, "", err
	}
	defer exp.Close(context.WithoutCancel(ctx))
	src, err := pgsession.Connect(ctx, source, "source")
	if err != nil {
		return 0, "", err
	}
	defer src.Close(context.WithoutCancel(ctx))
	tgt, err := pgsession.Connect(ctx, target, "target")
	if err != nil {
		return 0, "", err
	}
	defer tgt.Close(context.WithoutCancel(ctx))
	tx, err := apply.New(tgt, copyOnly).Begin(ctx)
	if err != nil {
		return 0, "", err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var written int64
	found, err := backfill.ReadKeys(ctx, src, exp.Snapshot, u.table, u.keys, func(ctx context.Context, rec arrow.RecordBatch) error {
		res, err := tx.ApplySnapshot(ctx, rec)
		written += res.Applied
		return err
	})
	if err != nil {
		return 0, "", err
	}
	if del := backfill.Tombstones(u.table, exp.Snapshot.LSN, u.keys, found); del != nil {
		res, err := tx.Apply(ctx, del)
		del.Release()
		if err != nil {
			return 0, "", err
		}
		written += res.Applied
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, "", fmt.Errorf("commit the filled values of %s: %w", u.table, err)
	}
	return written, exp.LSN.String(), nil
}

// distinctKeys returns keys without repeats (a key left unknown by several batches), in order;
// the values are text, which never holds a NUL, so NUL separates them.
func distinctKeys(keys [][]string) [][]string {
	seen := map[string]bool{}
	var out [][]string
	for _, k := range keys {
		id := strings.Join(k, "\x00")
		if !seen[id] {
			seen[id] = true
			out = append(out, k)
		}
	}
	return out
}
