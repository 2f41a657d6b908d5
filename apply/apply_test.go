package apply_test

import (
	"context"
	"fmt"
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

var acc = changebatch.Table{TableName: changebatch.TableName{Schema: "public", Name: "acc"}, Columns: []changebatch.Column{
	{Name: "id", Type: "integer", Key: true},
	{Name: "note", Type: "text"},
	{Name: "bal", Type: "integer"},
}}

type row struct {
	op   changebatch.Op
	lsn  uint64
	seq  uint64
	id   string
	note *string // nil: unchanged (TOAST)
	bal  string
}

func s(v string) *string { return &v }

// batch builds a change batch of acc from rows.
func batch(t *testing.T, rows ...row) arrow.RecordBatch {
	t.Helper()
	b := changebatch.NewBuilder(memory.NewGoAllocator(), acc)
	defer b.Release()
	for _, r := range rows {
		note := changebatch.Value{Unchanged: true}
		if r.note != nil {
			note = changebatch.Value{Text: *r.note}
		}
		bal := changebatch.Value{Text: r.bal}
		if r.op != changebatch.OpUpsert {
			note, bal = changebatch.Value{Null: true}, changebatch.Value{Null: true}
		}
		id := changebatch.Value{Text: r.id}
		if r.op == changebatch.OpTruncate {
			id = changebatch.Value{Null: true}
		}
		b.Append(changebatch.Change{Op: r.op, Version: changebatch.Version{LSN: pglogrepl.LSN(r.lsn), Seq: r.seq},
			Values: []changebatch.Value{id, note, bal}})
	}
	rec := b.NewBatch()
	t.Cleanup(rec.Release)
	return rec
}

type fixture struct {
	env *pgtest.Env
	ap  *apply.Applier
}

func setup(t *testing.T) fixture {
	env := pgtest.New(t)
	ctx := context.Background()
	if err := migrations.Apply(ctx, env.Target); err != nil {
		t.Fatal(err)
	}
	if _, err := apply.EnsureTable(ctx, env.Target, acc, 0, nil); err != nil {
		t.Fatal(err)
	}
	return fixture{env: env, ap: apply.New(env.Target, nil)}
}

// inTx runs fn in a target transaction, failing the test on its error, and commits unless fn
// returns false.
func (f fixture) inTx(t *testing.T, fn func(context.Context, *apply.Tx) (bool, error)) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.ap.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	commit, err := fn(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	if !commit {
		return
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func (f fixture) apply(t *testing.T, rec arrow.RecordBatch) (res apply.Result) {
	t.Helper()
	f.inTx(t, func(ctx context.Context, tx *apply.Tx) (bool, error) {
		var err error
		res, err = tx.Apply(ctx, rec)
		return true, err
	})
	return res
}

func (f fixture) expect(t *testing.T, want ...string) {
	t.Helper()
	got := pgtest.Rows(t, f.env.Target, `select format('%s|%s|%s|%s#%s|%s|%s', id, note, bal, _cdc_lsn, _cdc_seq, _cdc_deleted, _cdc_unknown) from acc order by id`)
	if d := pgtest.Diff(want, got); d != "" {
		t.Fatalf("target rows differ: %s\nwant %q\n got %q", d, want, got)
	}
}

func TestReplayedBatchIsSuppressed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rec := batch(t,
		row{changebatch.OpUpsert, 100, 1, "1", s("a"), "10"},
		row{changebatch.OpUpsert, 100, 2, "2", s("b"), "20"},
		row{changebatch.OpDelete, 100, 3, "3", nil, ""},
	)
	if got := f.apply(t, rec); !reflect.DeepEqual(got, apply.Result{Applied: 3}) {
		t.Fatalf("first apply = %+v, want 3 applied", got)
	}
	if got := f.apply(t, rec); !reflect.DeepEqual(got, apply.Result{Suppressed: 3}) {
		t.Fatalf("replay = %+v, want 3 suppressed", got)
	}
	f.expect(t, "1|a|10|0/64#1|f|", "2|b|20|0/64#2|f|", "3|||0/64#3|t|")
}

// The three worked cases of docs/design.md, watermark 5,000,000 and backfill snapshot 4,995,000.
func TestVersionRuleWorkedCases(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// 1. The stream applied a change at 4,994,500; the backfill carries its result and wins.
	f.apply(t, batch(t, row{changebatch.OpUpsert, 4_994_500, 1, "1", s("x"), "1"}))
	if got := f.apply(t, batch(t, row{changebatch.OpUpsert, 4_995_000, 0, "1", s("x"), "1"})); got.Applied != 1 {
		t.Fatalf("case 1: backfill = %+v, want applied", got)
	}
	// 2. The backfill applied first; the lagging stream's older change is a no-op.
	f.apply(t, batch(t, row{changebatch.OpUpsert, 4_995_000, 0, "2", s("y"), "2"}))
	if got := f.apply(t, batch(t, row{changebatch.OpUpsert, 4_994_800, 1, "2", s("old"), "0"})); got.Suppressed != 1 {
		t.Fatalf("case 2: stream = %+v, want suppressed", got)
	}
	// 3. A change after the snapshot: only the stream has it, and it wins.
	if got := f.apply(t, batch(t, row{changebatch.OpUpsert, 4_995_500, 1, "2", s("new"), "3"})); got.Applied != 1 {
		t.Fatalf("case 3: stream = %+v, want applied", got)
	}
	f.expect(t, "1|x|1|0/4C37B8#0|f|", "2|new|3|0/4C39AC#1|f|")
}

func TestTruncateFence(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.apply(t, batch(t,
		row{changebatch.OpUpsert, 100, 0, "1", s("a"), "1"},
		row{changebatch.OpUpsert, 300, 1, "2", s("b"), "2"},
	))
	got := f.apply(t, batch(t,
		row{changebatch.OpTruncate, 200, 1, "", nil, ""},
		row{changebatch.OpUpsert, 150, 1, "3", s("below fence"), "3"},
		row{changebatch.OpUpsert, 200, 2, "4", s("after truncate"), "4"},
	))
	if !reflect.DeepEqual(got, apply.Result{Applied: 1, Suppressed: 1, Truncates: 1}) {
		t.Fatalf("apply = %+v", got)
	}
	// Row 1 (older than the fence) is a tombstone; row 2 is newer than the fence and stays.
	f.expect(t, "1|a|1|0/C8#1|t|", "2|b|2|0/12C#1|f|", "4|after truncate|4|0/C8#2|f|")
	// A later-arriving version below the fence is refused even for a key the target never held.
	if got := f.apply(t, batch(t, row{changebatch.OpUpsert, 199, 9, "5", s("late"), "5"})); got.Suppressed != 1 {
		t.Fatalf("late row = %+v, want suppressed", got)
	}
}

func TestUnchangedToastKeepsTargetValue(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.apply(t, batch(t, row{changebatch.OpUpsert, 100, 0, "1", s("big value"), "1"}))
	f.apply(t, batch(t,
		row{changebatch.OpUpsert, 200, 1, "1", nil, "2"}, // existing row: keep the note
		row{changebatch.OpUpsert, 200, 2, "2", nil, "7"}, // unknown row: NULL, recorded as unknown
	))
	f.expect(t, "1|big value|2|0/C8#1|f|", "2||7|0/C8#2|f|{note}")
	// A later change that carries the value makes it known again.
	f.apply(t, batch(t, row{changebatch.OpUpsert, 300, 1, "2", s("known"), "8"}))
	f.expect(t, "1|big value|2|0/C8#1|f|", "2|known|8|0/12C#1|f|")
}

func TestTombstoneRefusesOlderInsert(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.apply(t, batch(t, row{changebatch.OpDelete, 500, 1, "1", nil, ""}))
	if got := f.apply(t, batch(t, row{changebatch.OpUpsert, 400, 0, "1", s("resurrected"), "1"})); got.Suppressed != 1 {
		t.Fatalf("older insert = %+v, want suppressed", got)
	}
	f.expect(t, "1|||0/1F4#1|t|")
}

// A source transaction larger than the memory bound is applied in parts; after a crash it is
// applied again from its start with other split points. A chain of key changes 3 → -3 → 3 whose
// first half was already written must still find the unchanged value (now in row -3).
func TestKeyChangeChainReplayedAfterPartialApply(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.apply(t, batch(t, row{changebatch.OpUpsert, 100, 0, "3", s("big 3"), "1"}))
	f.apply(t, batch(t,
		row{changebatch.OpDelete, 200, 1, "3", nil, ""},
		row{changebatch.OpUpsert, 200, 1, "-3", nil, "1"},
	))
	f.expect(t, "-3|big 3|1|0/C8#1|f|", "3|||0/C8#1|t|")
	f.apply(t, batch(t,
		row{changebatch.OpDelete, 200, 1, "3", nil, ""},
		row{changebatch.OpUpsert, 200, 1, "-3", nil, "1"},
		row{changebatch.OpDelete, 200, 5, "-3", nil, ""},
		row{changebatch.OpUpsert, 200, 5, "3", nil, "2"},
	))
	f.expect(t, "-3|||0/C8#5|t|", "3|big 3|2|0/C8#5|f|")
}

// Replayed chain 1 → 2, 5 → 1, 2 → 3 after its first two moves were written: key 1 then holds
// another row (the one from 5), so the value for 3 must come from key 2, not from key 1.
func TestKeyChangeChainIgnoresReusedKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.apply(t, batch(t,
		row{changebatch.OpUpsert, 100, 0, "1", s("X1"), "1"},
		row{changebatch.OpUpsert, 100, 0, "5", s("X5"), "5"},
	))
	part1 := []row{
		{changebatch.OpDelete, 200, 1, "1", nil, ""},
		{changebatch.OpUpsert, 200, 1, "2", nil, "1"},
		{changebatch.OpDelete, 200, 2, "5", nil, ""},
		{changebatch.OpUpsert, 200, 2, "1", nil, "5"},
	}
	f.apply(t, batch(t, part1...))
	f.expect(t, "1|X5|5|0/C8#2|f|", "2|X1|1|0/C8#1|f|", "5|||0/C8#2|t|")
	f.apply(t, batch(t, append(part1,
		row{changebatch.OpDelete, 200, 3, "2", nil, ""},
		row{changebatch.OpUpsert, 200, 3, "3", nil, "1"})...))
	f.expect(t, "1|X5|5|0/C8#2|f|", "2|||0/C8#3|t|", "3|X1|1|0/C8#3|f|", "5|||0/C8#2|t|")
}

// In one transaction: delete 2, move 1 → 2, move 2 → 3. The target still holds the deleted row 2
// (newer than row 1) while the batch is staged; it must not supply the value of row 3.
func TestKeyChangeChainIgnoresTheKeysPreviousRow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.apply(t, batch(t,
		row{changebatch.OpUpsert, 100, 0, "1", s("X1"), "1"},
		row{changebatch.OpUpsert, 150, 1, "2", s("X2"), "2"},
	))
	f.apply(t, batch(t,
		row{changebatch.OpDelete, 200, 1, "2", nil, ""},
		row{changebatch.OpDelete, 200, 2, "1", nil, ""},
		row{changebatch.OpUpsert, 200, 2, "2", nil, "1"},
		row{changebatch.OpDelete, 200, 3, "2", nil, ""},
		row{changebatch.OpUpsert, 200, 3, "3", nil, "1"},
	))
	f.expect(t, "1|||0/C8#2|t|", "2|||0/C8#3|t|", "3|X1|1|0/C8#3|f|")
}

// A batch longer than one staged merge is merged in pieces (60,001 changes here) with the batch's
// outcome: keys inserted in one piece are updated in a later one, and a key change on the
// boundary between pieces keeps its tombstone and its upsert together, so the new key still takes
// the value the change left unchanged from the old key's row.
func TestLongBatchIsMergedInPieces(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var rows []row
	for i := 1; i < 50_000; i++ {
		rows = append(rows, row{op: changebatch.OpUpsert, lsn: 100, seq: uint64(i), id: fmt.Sprint(i), note: s(fmt.Sprint("n", i)), bal: "0"})
	}
	// Rows 50,000 and 50,001: key 1 becomes key 100000, its note left unchanged (TOAST).
	rows = append(rows, row{op: changebatch.OpDelete, lsn: 100, seq: 50_000, id: "1"},
		row{op: changebatch.OpUpsert, lsn: 100, seq: 50_000, id: "100000", bal: "7"})
	for i := 2; i <= 10_001; i++ {
		rows = append(rows, row{op: changebatch.OpUpsert, lsn: 200, seq: uint64(i), id: fmt.Sprint(i), note: s(fmt.Sprint("n", i)), bal: "1"})
	}
	f.apply(t, batch(t, rows...))
	got := pgtest.Rows(t, f.env.Target, `select count(*) filter (where not _cdc_deleted) || ' ' || sum(bal) filter (where not _cdc_deleted) || ' ' ||
  (select note || ' ' || coalesce(_cdc_unknown::text, 'known') from acc where id = 100000) || ' ' || (select _cdc_deleted from acc where id = 1) from acc`)
	if d := pgtest.Diff([]string{"49999 10007 n1 known true"}, got); d != "" {
		t.Errorf("live rows, their balance, the moved row, the old key: %s", d)
	}
}

// A staging table (COPY's, for pieces too large to merge inline) keeps its rows past a commit and is emptied at its next use (by TRUNCATE after
// many rows, else DELETE): every merge sees exactly its own rows, after a large batch, a small
// one, and a transaction rolled back.
func TestStagingHoldsOnlyTheBatchMerged(t *testing.T) {
	t.Parallel()
	f := setup(t)
	apply.StageByCOPY(t, f.ap, acc.TableName)
	rowsOf := func(lsn uint64, from, to int) arrow.RecordBatch {
		var rows []row
		for i := from; i <= to; i++ {
			rows = append(rows, row{op: changebatch.OpUpsert, lsn: lsn, seq: uint64(i), id: fmt.Sprint(i), note: s("n"), bal: fmt.Sprint(lsn)})
		}
		return batch(t, rows...)
	}
	var held int64
	for _, c := range []struct {
		name     string
		rec      arrow.RecordBatch
		rollback bool
	}{
		{"3,000 inserts", rowsOf(100, 1, 3000), false},
		{"10 updates after a batch over the truncate threshold", rowsOf(200, 1, 10), false},
		{"5 inserts", rowsOf(300, 3001, 3005), false},
		{"7 inserts rolled back", rowsOf(400, 3006, 3012), true},
		{"3 inserts after the rollback", rowsOf(500, 3013, 3015), false},
	} {
		var res apply.Result
		f.inTx(t, func(ctx context.Context, tx *apply.Tx) (bool, error) {
			var err error
			res, err = tx.Apply(ctx, c.rec)
			return !c.rollback, err
		})
		if want := c.rec.NumRows(); res.Applied != want || res.Suppressed != 0 {
			t.Errorf("%s: applied %d and suppressed %d, want %d and 0", c.name, res.Applied, res.Suppressed, want)
		}
		if !c.rollback {
			held = c.rec.NumRows()
		}
		// The staging table is the session's own temporary table: visible on the same connection.
		if n := pgtest.Scalar[int64](t, f.env.Target, `select count(*) from pg_temp.pgconverge_stage_1`); n != held {
			t.Errorf("%s: the staging table holds %d rows, want the last committed batch's %d", c.name, n, held)
		}
	}
	got := pgtest.Rows(t, f.env.Target, `select count(*) || ' ' || count(*) filter (where bal = 200) || ' ' || count(*) filter (where id between 3006 and 3012) from acc`)
	if d := pgtest.Diff([]string{"3008 10 0"}, got); d != "" {
		t.Errorf("rows, updated rows, rolled-back rows: %s", d)
	}
}

// A group's leading one-statement batches are pipelined with the fences and the progress; a
// batch that is not (a TRUNCATE) and every batch after it are applied in order after them, so a
// late version after the fence is refused, not written and then turned into a tombstone.
func TestApplyGroupKeepsTheBatchesOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	recs := []arrow.RecordBatch{
		batch(t, row{changebatch.OpUpsert, 100, 1, "1", s("a"), "1"}, row{changebatch.OpUpsert, 100, 2, "1", s("b"), "2"}),
		batch(t, row{changebatch.OpUpsert, 110, 1, "4", s("d"), "4"}),
		batch(t, row{changebatch.OpTruncate, 200, 1, "", nil, ""}, row{changebatch.OpUpsert, 200, 2, "2", s("c"), "3"}),
		batch(t, row{changebatch.OpUpsert, 150, 1, "3", s("late"), "9"}),
	}
	var got []apply.Result
	f.inTx(t, func(ctx context.Context, tx *apply.Tx) (bool, error) {
		var err error
		got, err = tx.ApplyGroup(ctx, recs, apply.Progress{Slot: "s1", LSN: 300})
		return true, err
	})
	want := []apply.Result{{Applied: 1, Merged: 1}, {Applied: 1}, {Applied: 1, Truncates: 1}, {Suppressed: 1}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("results = %+v, want %+v", got, want)
	}
	f.expect(t, "1|b|2|0/C8#1|t|", "2|c|3|0/C8#2|f|", "4|d|4|0/C8#1|t|")
	if lsn := pgtest.Scalar[string](t, f.env.Target, `select applied_lsn::text from pgconverge.progress where slot = 's1'`); lsn != "0/12C" {
		t.Errorf("progress = %s, want 0/12C", lsn)
	}
}
