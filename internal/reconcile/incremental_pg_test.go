package reconcile

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// Incremental comparisons against the test clusters: s.t as kvTable makes it (2000 rows, 8
// groups), each comparison in a REPEATABLE READ transaction on either side, built on the memo of
// the one before. Every test changes rows in a way a comparison that skipped too much would miss.

// incCompare compares tab incrementally from prev and returns the differences (ordered by key) and
// the stats, whose Memo the next comparison builds on.
func incCompare(t *testing.T, env *pgtest.Env, tab changebatch.Table, prev *Memo) ([]string, Stats) {
	t.Helper()
	return incCompareWith(t, env, tab, Incremental{Previous: prev, Bits: 3, XidList: xidList(t)})
}

// incCompareWith compares tab with inc, as incCompare.
func incCompareWith(t *testing.T, env *pgtest.Env, tab changebatch.Table, inc Incremental) ([]string, Stats) {
	t.Helper()
	ctx := t.Context()
	opts := pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}
	stx, err := env.Source.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer stx.Rollback(context.WithoutCancel(ctx))
	ttx, err := env.Target.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer ttx.Rollback(context.WithoutCancel(ctx))
	var diffs []string
	st, err := Compare(ctx, stx, ttx, Config{Table: tab, Snapshot: pgSnapshot, Mode: TypeHash, LeafRows: 64,
		Incremental: &inc,
		Emit: func(_ context.Context, d []Diff) error {
			for _, x := range d {
				diffs = append(diffs, fmt.Sprintf("%s %s", x.Key[0], x.Kind))
			}
			return nil
		}})
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	if st.Memo == nil {
		t.Fatal("an incremental comparison returned no memo")
	}
	slices.Sort(diffs)
	return diffs, st
}

// settle compares tab from memo again and again, nothing changing in between, until ok accepts
// the stats (at most 30 s), every comparison finding exactly want; it returns the last one's
// stats. A transaction of another test, running in the cluster when a comparison takes its
// snapshot, holds that snapshot's xmin back, so that the next comparison sees rows committed
// after that transaction began as changed (safe: their groups are hashed); the one after sees
// past it.
func settle(t *testing.T, env *pgtest.Env, tab changebatch.Table, memo *Memo, what string, ok func(Stats) bool, want ...string) Stats {
	t.Helper()
	return settleWith(t, what, ok, memo, func(m *Memo) ([]string, Stats) { return incCompare(t, env, tab, m) }, want...)
}

// settleWith is settle over compare.
func settleWith(t *testing.T, what string, ok func(Stats) bool, memo *Memo, compare func(*Memo) ([]string, Stats), want ...string) Stats {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		diffs, st := compare(memo)
		wantDiffs(t, what, diffs, st, want...)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: stats %+v after 30 s of comparisons", what, st)
		}
		memo = st.Memo
		time.Sleep(100 * time.Millisecond)
	}
}

// skipped returns a settle condition: n groups skipped.
func skipped(n int64) func(Stats) bool { return func(st Stats) bool { return st.Skipped == n } }

// xidList is Incremental.XidList for a subtest of eachXidTest: "age" tests rows' xmin by age()
// only, "list" by the list of the xids since the memo (the default for few xids).
func xidList(t *testing.T) int {
	if strings.HasSuffix(t.Name(), "/age") {
		return -1
	}
	return 0
}

// eachXidTest runs test once with each way of testing a row's xmin (xidList).
func eachXidTest(t *testing.T, test func(t *testing.T)) {
	for _, name := range []string{"list", "age"} {
		t.Run(name, test)
	}
}

// wantDiffs fails the test unless got are want (each "key kind", in sorted order).
func wantDiffs(t *testing.T, what string, got []string, st Stats, want ...string) {
	t.Helper()
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s: differences %q, want %q (stats %+v)", what, got, want, st)
	}
}

// equalTwice compares the equal tables: the first comparison hashes every group, the next skips
// every one (settle); it returns the last one's memo.
func equalTwice(t *testing.T, env *pgtest.Env) *Memo {
	t.Helper()
	diffs, st := incCompare(t, env, tabKV, nil)
	wantDiffs(t, "first", diffs, st)
	if st.MemoUsed || st.Skipped != 0 || st.Groups != 8 || st.SourceRows != 2000 || len(st.Memo.Groups) != 8 {
		t.Fatalf("first comparison: stats %+v, want 8 groups hashed", st)
	}
	st = settle(t, env, tabKV, st.Memo, "unchanged", skipped(8))
	if !st.MemoUsed || st.SourceRows != 2000 || st.Compared != 2000 {
		t.Fatalf("unchanged: stats %+v, want every group skipped", st)
	}
	return st.Memo
}

// Changes on the source after a comparison (update, delete, delete and insert of the same count)
// and hand edits of the target are found by the next, which hashes only the groups they touched
// (or counts every group's rows, when a delete left no trace but the count).
func TestIncrementalFindsEveryChange(t *testing.T) {
	eachXidTest(t, func(t *testing.T) {
		env := pgtest.New(t)
		kvTable(t, env, 2000)
		memo := equalTwice(t, env)

		pgtest.Exec(t, env.Source, `update s.t set v = 'changed' where k = 11`)
		diffs, st := incCompare(t, env, tabKV, memo)
		wantDiffs(t, "an update on the source", diffs, st, "11 different")
		st = settle(t, env, tabKV, st.Memo, "an update on the source", skipped(7), "11 different")
		// The group that differs stays out of the memo's equal groups: the next run finds it again.
		diffs, st = incCompare(t, env, tabKV, st.Memo)
		wantDiffs(t, "the update, again", diffs, st, "11 different")
		pgtest.Exec(t, env.Target, `update s.t set v = 'changed' where k = 11`)
		diffs, st = incCompare(t, env, tabKV, st.Memo)
		wantDiffs(t, "the update applied", diffs, st)
		memo = st.Memo

		pgtest.Exec(t, env.Source, `delete from s.t where k = 12`)
		diffs, st = incCompare(t, env, tabKV, memo)
		wantDiffs(t, "a delete on the source", diffs, st, "12 extra")
		pgtest.Exec(t, env.Target, `delete from s.t where k = 12`)
		diffs, st = incCompare(t, env, tabKV, st.Memo)
		wantDiffs(t, "the delete applied", diffs, st)

		// As many rows as before: a delete in one group, an insert in another.
		pgtest.Exec(t, env.Source, `delete from s.t where k = 13`, `insert into s.t values (5000, 'v5000')`)
		if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from s.t`); n != 1999 {
			t.Fatalf("source rows %d, want 1999", n)
		}
		diffs, st = incCompare(t, env, tabKV, st.Memo)
		wantDiffs(t, "a delete and an insert on the source", diffs, st, "13 extra", "5000 missing")
		pgtest.Exec(t, env.Target, `delete from s.t where k = 13`, `insert into s.t values (5000, 'v5000', '0/900', 1)`)
		diffs, st = incCompare(t, env, tabKV, st.Memo)
		wantDiffs(t, "the delete and insert applied", diffs, st)

		// Hand edits of the target: a value, a tombstone, a row gone.
		pgtest.Exec(t, env.Target, `update s.t set v = 'by hand' where k = 21`, `update s.t set _cdc_deleted = true where k = 22`,
			`delete from s.t where k = 23`)
		diffs, st = incCompare(t, env, tabKV, st.Memo)
		wantDiffs(t, "hand edits of the target", diffs, st, "21 different", "22 missing", "23 missing")
	})
}

// A transaction in progress at a comparison's snapshot, committed after it, is found by the next
// comparison: its xid is at or after that snapshot's xmin, though below its xmax.
func TestIncrementalTransactionInProgressAtTheSnapshot(t *testing.T) {
	eachXidTest(t, func(t *testing.T) {
		env := pgtest.New(t)
		kvTable(t, env, 2000)
		memo := equalTwice(t, env)
		other := pgtest.Connect(t, env.SourceURL)
		tx, err := other.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(t.Context(), `update s.t set v = 'late' where k = 31`); err != nil {
			t.Fatal(err)
		}
		// A transaction that starts and commits after the one above, so the snapshot's xmax lies
		// beyond the open one's xid.
		pgtest.Exec(t, env.Source, `update s.t set v = 'early' where k = 32`)
		pgtest.Exec(t, env.Target, `update s.t set v = 'early' where k = 32`)
		diffs, st := incCompare(t, env, tabKV, memo)
		wantDiffs(t, "with a transaction in progress", diffs, st)
		if err := tx.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
		diffs, st = incCompare(t, env, tabKV, st.Memo)
		wantDiffs(t, "once it committed", diffs, st, "31 different")
	})
}

// VACUUM FREEZE between comparisons changes nothing a comparison sees: unchanged groups are still
// skipped, and a row changed just before the freeze is still found.
func TestIncrementalAcrossVacuumFreeze(t *testing.T) {
	eachXidTest(t, func(t *testing.T) {
		env := pgtest.New(t)
		kvTable(t, env, 2000)
		memo := equalTwice(t, env)
		pgtest.Exec(t, env.Source, `vacuum (freeze) s.t`)
		pgtest.Exec(t, env.Target, `vacuum (freeze) s.t`)
		st := settle(t, env, tabKV, memo, "after a freeze", skipped(8))
		var diffs []string
		pgtest.Exec(t, env.Source, `update s.t set v = 'frozen' where k = 41`)
		pgtest.Exec(t, env.Target, `update s.t set v = 'by hand' where k = 42`)
		pgtest.Exec(t, env.Source, `vacuum (freeze) s.t`)
		pgtest.Exec(t, env.Target, `vacuum (freeze) s.t`)
		diffs, st = incCompare(t, env, tabKV, st.Memo)
		wantDiffs(t, "changes frozen before the comparison", diffs, st, "41 different", "42 different")
		// VACUUM FULL rewrites the table: nothing is missed either.
		pgtest.Exec(t, env.Target, `update s.t set v = 'full' where k = 43`, `vacuum full s.t`)
		diffs, st = incCompare(t, env, tabKV, st.Memo)
		wantDiffs(t, "a change rewritten by VACUUM FULL", diffs, st, "41 different", "42 different", "43 different")
	})
}

// A new column (added with a default, which rewrites no row and leaves every xmin as it was)
// changes the hashes compared: the memo of the old shape is not used, and the new column's
// different values are found.
func TestIncrementalAfterASchemaChange(t *testing.T) {
	eachXidTest(t, func(t *testing.T) {
		env := pgtest.New(t)
		kvTable(t, env, 2000)
		memo := equalTwice(t, env)
		pgtest.Exec(t, env.Source, `alter table s.t add column w int default 1`)
		pgtest.Exec(t, env.Target, `alter table s.t add column w int default 2`)
		tab := tabKV
		tab.Columns = append(slices.Clone(tabKV.Columns), changebatch.Column{Name: "w", Type: "integer", TypeOID: oidInt4})
		diffs, st := incCompare(t, env, tab, memo)
		if st.MemoUsed || st.Skipped != 0 || len(diffs) != 2000 || !strings.HasSuffix(diffs[0], " different") {
			t.Errorf("after adding a column: %d differences, stats %+v, want 2000 found without the old memo", len(diffs), st)
		}
	})
}

// Differences scattered over most groups of the first level are narrowed down by key hash before
// rows are fetched, as a full comparison's are.
func TestIncrementalNarrowsScatteredDifferences(t *testing.T) {
	eachXidTest(t, func(t *testing.T) {
		env := pgtest.New(t)
		kvTable(t, env, 2000)
		memo := equalTwice(t, env)
		pgtest.Exec(t, env.Target, `update s.t set v = 'by hand' where k in (101, 202, 303, 404, 505, 606, 707)`)
		diffs, st := incCompare(t, env, tabKV, memo)
		wantDiffs(t, "scattered hand edits", diffs, st, "101 different", "202 different", "303 different", "404 different",
			"505 different", "606 different", "707 different")
		if st.Levels == 0 || st.RowsFetched > 400 {
			t.Errorf("scattered hand edits: %d levels, %d rows fetched, want them narrowed down first", st.Levels, st.RowsFetched)
		}
	})
}

// With Whole, a comparison without a memo checksums the whole table as one group; the next one
// skips it while nothing changed, hashes the table by groups at the first change, and only the
// changed groups after that.
func TestIncrementalFromTheWholeTable(t *testing.T) {
	env := pgtest.New(t)
	kvTable(t, env, 2000)
	whole := func(prev *Memo) ([]string, Stats) {
		return incCompareWith(t, env, tabKV, Incremental{Previous: prev, Bits: 3, Whole: true})
	}
	compare := func(what string, prev *Memo, want ...string) Stats {
		t.Helper()
		diffs, st := whole(prev)
		wantDiffs(t, what, diffs, st, want...)
		return st
	}
	st := compare("first", nil)
	if st.Groups != 1 || st.Memo.Bits != 0 || len(st.Memo.Groups) != 1 {
		t.Fatalf("first comparison: stats %+v, memo bits %d, want the whole table as one group", st, st.Memo.Bits)
	}
	st = settleWith(t, "unchanged", func(st Stats) bool { return st.Skipped == 1 && st.Groups == 1 }, st.Memo, whole)
	pgtest.Exec(t, env.Source, `update s.t set v = 'changed' where k = 51`)
	st = compare("the first change", st.Memo, "51 different")
	if st.Skipped != 0 || st.Memo.Bits != 3 || len(st.Memo.Groups) != 8 {
		t.Fatalf("the first change: stats %+v, memo bits %d, want the table hashed by 8 groups", st, st.Memo.Bits)
	}
	pgtest.Exec(t, env.Target, `update s.t set v = 'changed' where k = 51`, `update s.t set v = 'by hand' where k = 52`)
	compare("a hand edit", st.Memo, "52 different")
	settleWith(t, "a hand edit", func(st Stats) bool { return st.Skipped >= 7 }, st.Memo, whole, "52 different")
}
