package engine

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// unknownQueue is how many batches of keys with unknown values wait for unknownFiller.Run; more are
// left to verify --repair, with an ERROR saying so.
const unknownQueue = 64

// unknownKeys are keys of one table whose target rows the stream left with unknown values
// (apply.Result.Unknown).
type unknownKeys struct {
	table changebatch.Table
	keys  [][]string
}

// unknownFiller is the session member that fills, while the session streams, the target values
// the stream could not know (apply.Result.Unknown: unchanged TOAST the source left out). It owns
// its queue of keys: the stream's apply goroutine hands it keys with note, after each commit,
// without waiting; its own goroutine (Run) fills them. It tells the tombstone pruner, through
// gate, when a fill's snapshot is under way.
type unknownFiller struct {
	source, target string
	primary        string                // Config.Primary
	copyOnly       *apply.CopyOnlyTables // the daemon's (apply.New)
	logger         *slog.Logger
	// tables are the session's streamed tables, as described at its start.
	tables []changebatch.Table
	queue  chan unknownKeys
	gate   *fillGate
}

// newUnknownFiller returns the filler of cfg's session streaming tables, with an empty queue of
// unknownQueue batches, telling gate about its fills.
func newUnknownFiller(cfg Config, tables []changebatch.Table, gate *fillGate) *unknownFiller {
	return &unknownFiller{source: cfg.Source, primary: cfg.Primary, target: cfg.Target, copyOnly: cfg.copyOnly, logger: cfg.Logger,
		tables: tables, queue: make(chan unknownKeys, unknownQueue), gate: gate}
}

// note hands the keys a committed stream transaction left with unknown values (by table name,
// changebatch.Table.String) to Run without waiting; when its queue is full they are logged at
// ERROR with the fix. Only the stream's apply goroutine calls it.
func (f *unknownFiller) note(byTable map[string][][]string) {
	for name, keys := range byTable {
		t, ok := f.tableNamed(name)
		if !ok {
			continue
		}
		select {
		case f.queue <- unknownKeys{table: t, keys: keys}:
		default:
			f.logger.Error("target rows lack values the source left out as unchanged TOAST, and too many wait to be filled: run pgconverge verify --repair --table "+name,
				"table", name, "rows", len(keys))
		}
	}
}

// tableNamed returns the description of the streamed table whose String is name.
func (f *unknownFiller) tableNamed(name string) (changebatch.Table, bool) {
	for _, t := range f.tables {
		if t.String() == name {
			return t, true
		}
	}
	return changebatch.Table{}, false
}

// Run fills the keys noted: for each batch of keys it reads those rows from a fresh exact
// snapshot S' of the source (through the table's row filter) and writes them through the apply
// step at (S', 0), or a tombstone where S' has no row, in one target transaction. S' follows the
// commit that left them unknown, so the snapshot's rows are newer; a change streamed after S'
// still wins by the version rule. A failure is logged at ERROR with the fix (verify --repair) and
// never ends the session. It returns nil when ctx ends.
func (f *unknownFiller) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case u := <-f.queue:
			for _, u := range drainUnknown(u, f.queue) {
				f.gate.begin() // before the fill's snapshot: the pruner's round waits for it (tombstonePruner)
				filled, at, err := fillKeys(ctx, f.source, f.primary, f.target, f.copyOnly, u, pgsession.LogSlotWait(f.logger))
				f.gate.end()
				switch {
				case ctx.Err() != nil:
					return nil
				case err != nil:
					f.logger.Error("could not fill target values the source left out as unchanged TOAST: run pgconverge verify --repair --table "+u.table.String(),
						"table", u.table.String(), "rows", len(u.keys), "err", err)
				default:
					f.logger.Info("filled target values the source left out as unchanged TOAST, from a fresh snapshot",
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
// the rows written and the snapshot's LSN; primary is Config.Primary, copyOnly the daemon's
// (apply.New); waits is told of a snapshot slot's creation that waits (backfill.Export).
func fillKeys(ctx context.Context, source, primary, target string, copyOnly *apply.CopyOnlyTables, u unknownKeys, waits func(pgsession.SlotWait)) (int64, string, error) {
	u.keys = distinctKeys(u.keys)
	exp, err := backfill.Export(ctx, source, primary, waits)
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
