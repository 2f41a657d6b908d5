package apply_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/migrations"
)

var logTable = changebatch.Table{TableName: changebatch.TableName{Schema: "public", Name: "log"}, Keyless: true,
	Columns: []changebatch.Column{{Name: "v", Type: "text"}, {Name: "doc", Type: "json"}}}

// change is one change of logTable: op at (lsn, seq) of value v (doc NULL), or a snapshot row
// (seq 0) with occurrence occ.
type change struct {
	op       changebatch.Op
	lsn, seq uint64
	v        string
	occ      uint64
}

func logBatch(t *testing.T, cs ...change) arrow.RecordBatch {
	t.Helper()
	b := changebatch.NewBuilder(memory.NewGoAllocator(), logTable)
	defer b.Release()
	for _, c := range cs {
		vals := []changebatch.Value{{Text: c.v}, {Null: true}}
		ver := changebatch.Version{LSN: pglogrepl.LSN(c.lsn), Seq: c.seq}
		if c.seq == 0 {
			b.AppendSnapshotOccurrence(ver, c.occ, [][]byte{[]byte(c.v), nil})
			continue
		}
		b.Append(changebatch.Change{Op: c.op, Version: ver, Values: vals})
	}
	rec := b.NewBatch()
	t.Cleanup(rec.Release)
	return rec
}

func keylessSetup(t *testing.T) fixture {
	env := pgtest.New(t)
	ctx := context.Background()
	if err := migrations.Apply(ctx, env.Target); err != nil {
		t.Fatal(err)
	}
	if _, err := apply.EnsureTable(ctx, env.Target, logTable, 0, nil); err != nil {
		t.Fatal(err)
	}
	return fixture{env: env, ap: apply.New(env.Target, nil)}
}

// live returns the live copies of each value, as "value xN", in value order.
func (f fixture) live(t *testing.T) []string {
	return pgtest.Rows(t, f.env.Target, `select v || ' x' || count(*) from log where not _cdc_deleted group by v order by v`)
}

func requireLive(t *testing.T, f fixture, want ...string) {
	t.Helper()
	if d := pgtest.Diff(want, f.live(t)); d != "" {
		t.Fatalf("live copies: %s; got %q", d, f.live(t))
	}
}

const (
	I = changebatch.OpUpsert
	D = changebatch.OpDelete
)

// Streamed changes of duplicates: a replayed batch is suppressed whole, and a DELETE of a value
// the target never held leaves a phantom that takes no copy.
func TestKeylessStreamReplay(t *testing.T) {
	t.Parallel()
	f := keylessSetup(t)
	rec := logBatch(t, change{I, 100, 1, "a", 0}, change{I, 100, 2, "a", 0}, change{I, 100, 3, "a", 0},
		change{D, 100, 4, "a", 0}, change{D, 100, 5, "b", 0}, change{I, 100, 6, "b", 0})
	if got := f.apply(t, rec); !reflect.DeepEqual(got, apply.Result{Applied: 6}) {
		t.Fatalf("first apply = %+v, want 6 applied", got)
	}
	requireLive(t, f, "a x2", "b x1")
	if got := f.apply(t, rec); !reflect.DeepEqual(got, apply.Result{Suppressed: 6}) {
		t.Fatalf("replay = %+v, want 6 suppressed", got)
	}
	requireLive(t, f, "a x2", "b x1")
	// A DELETE newer than both copies takes the newest; then one more takes the other.
	f.apply(t, logBatch(t, change{D, 200, 1, "a", 0}))
	f.apply(t, logBatch(t, change{D, 200, 2, "a", 0}))
	requireLive(t, f, "b x1")
	f.apply(t, logBatch(t, change{D, 200, 2, "a", 0}))
	requireLive(t, f, "b x1")
}

// The snapshot's worked cases, snapshot S = 1000 with three copies of "a" and one of "c":
//  1. the stream applied, before the snapshot's rows arrive, an INSERT of "a" at 900 (in the
//     snapshot) and a DELETE of "a" at 1100 (after it), which took the 900 copy;
//  2. the stream applied a DELETE of "c" at 1200 while the target had no copy (a phantom);
//  3. "d" has a copy from an older snapshot at 500 that the source deleted before S.
//
// The snapshot makes "a" 3 - 1 = 2 copies, "c" 1 - 1 = 0; the fence at S removes "d"; stream
// changes at or below S replayed afterwards are suppressed; the same snapshot rows read again
// (a chunk retried) add nothing.
func TestKeylessSnapshotMeetsTheStream(t *testing.T) {
	t.Parallel()
	f := keylessSetup(t)
	f.applySnapshot(t, logBatch(t, change{v: "d", lsn: 500, occ: 1}))
	f.apply(t, logBatch(t, change{I, 900, 1, "a", 0}))
	f.apply(t, logBatch(t, change{D, 1100, 1, "a", 0}))
	f.apply(t, logBatch(t, change{D, 1200, 1, "c", 0}))
	requireLive(t, f, "d x1")
	first := logBatch(t, change{v: "a", lsn: 1000, occ: 1}, change{v: "a", lsn: 1000, occ: 2})
	rest := logBatch(t, change{v: "a", lsn: 1000, occ: 7}, change{v: "c", lsn: 1000, occ: 9})
	if got := f.applySnapshot(t, first); got.Applied != 2 {
		t.Fatalf("first snapshot batch = %+v, want 2 applied", got)
	}
	f.applySnapshot(t, rest)
	requireLive(t, f, "a x2", "d x1")
	if got := f.applySnapshot(t, rest); got.Applied != 0 {
		t.Fatalf("snapshot batch read again = %+v, want nothing applied", got)
	}
	f.inTx(t, func(ctx context.Context, tx *apply.Tx) (bool, error) {
		_, err := tx.Fence(ctx, logTable, changebatch.Version{LSN: 1000})
		return true, err
	})
	requireLive(t, f, "a x2")
	if got := f.apply(t, logBatch(t, change{I, 900, 1, "a", 0}, change{D, 950, 1, "a", 0}, change{D, 1100, 1, "a", 0})); got.Applied != 0 {
		t.Fatalf("replay around the snapshot = %+v, want nothing applied", got)
	}
	requireLive(t, f, "a x2")
	// A newer snapshot replaces the value's copies; an older one arriving late changes nothing.
	f.applySnapshot(t, logBatch(t, change{v: "a", lsn: 3000, occ: 1}))
	requireLive(t, f, "a x1")
	if got := f.applySnapshot(t, logBatch(t, change{v: "a", lsn: 2000, occ: 1}, change{v: "a", lsn: 2000, occ: 2})); got.Applied != 0 {
		t.Fatalf("an older snapshot after a newer one = %+v, want nothing applied", got)
	}
	requireLive(t, f, "a x1")
	if n := pgtest.Scalar[int64](t, f.env.Target, `select count(*) from log where _cdc_occurrence = 0 and _cdc_seq > 0`); n != 0 {
		t.Errorf("%d phantoms left after the fence, want 0", n)
	}
}

// Several deletes of one value in one batch go in rounds, in their order, each taking the newest
// copy older than it that no earlier one took (never one born after it, even in the same
// batch); a batch delivered again, or again with more changes, applies only what it did not.
func TestKeylessDeleteRounds(t *testing.T) {
	t.Parallel()
	f := keylessSetup(t)
	rec := logBatch(t, change{I, 100, 1, "a", 0}, change{I, 100, 2, "a", 0}, change{I, 100, 3, "a", 0}, change{I, 100, 4, "b", 0},
		change{D, 100, 5, "a", 0}, change{D, 100, 6, "a", 0}, change{D, 100, 7, "b", 0},
		change{D, 100, 8, "c", 0}, change{D, 100, 9, "c", 0}, change{I, 100, 10, "a", 0})
	if got := f.apply(t, rec); !reflect.DeepEqual(got, apply.Result{Applied: 10}) {
		t.Fatalf("first apply = %+v, want 10 applied", got)
	}
	requireLive(t, f, "a x2")
	if got := pgtest.Rows(t, f.env.Target, `select _cdc_seq || ':' || coalesce(_cdc_deleted_seq::text, '-') from log where v = 'a' order by _cdc_seq`); !reflect.DeepEqual(got, []string{"1:-", "2:6", "3:5", "10:-"}) {
		t.Fatalf("entries of a (seq:deleted by) = %q, want the deletes at 5 and 6 to take the copies at 3 and 2", got)
	}
	if n := pgtest.Scalar[int64](t, f.env.Target, `select count(*) from log where v = 'c' and _cdc_occurrence = 0 and _cdc_deleted`); n != 2 {
		t.Fatalf("%d phantoms of c, want 2", n)
	}
	if got := f.apply(t, rec); !reflect.DeepEqual(got, apply.Result{Suppressed: 10}) {
		t.Fatalf("replay = %+v, want 10 suppressed", got)
	}
	requireLive(t, f, "a x2")
	f.apply(t, logBatch(t, change{D, 200, 1, "a", 0}))
	again := logBatch(t, change{D, 200, 1, "a", 0}, change{D, 200, 2, "a", 0}, change{D, 200, 3, "a", 0})
	if got := f.apply(t, again); !reflect.DeepEqual(got, apply.Result{Applied: 2, Suppressed: 1}) {
		t.Fatalf("three deletes of a, the first delivered before = %+v, want 2 applied, 1 suppressed", got)
	}
	requireLive(t, f)
	if n := pgtest.Scalar[int64](t, f.env.Target, `select count(*) from log where v = 'a' and _cdc_occurrence = 0 and _cdc_deleted_lsn = '0/C8'`); n != 1 {
		t.Fatalf("%d phantoms of a at 0/C8, want 1 (the third delete found no copy)", n)
	}
}

// An insert staged twice in one batch (the same version) adds one entry, as when it is delivered
// twice in two batches; another insert of the value at another version adds its own.
func TestKeylessInsertStagedTwice(t *testing.T) {
	t.Parallel()
	f := keylessSetup(t)
	rec := logBatch(t, change{I, 100, 1, "a", 0}, change{I, 100, 1, "a", 0}, change{I, 100, 2, "a", 0})
	if got := f.apply(t, rec); !reflect.DeepEqual(got, apply.Result{Applied: 2, Suppressed: 1}) {
		t.Fatalf("apply = %+v, want 2 applied, 1 suppressed", got)
	}
	requireLive(t, f, "a x2")
	if got := f.apply(t, rec); !reflect.DeepEqual(got, apply.Result{Suppressed: 3}) {
		t.Fatalf("replay = %+v, want 3 suppressed", got)
	}
	requireLive(t, f, "a x2")
}
