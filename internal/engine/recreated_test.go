package engine_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/backfillrun"

	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// requireVerifyClean runs verify and fails the test unless it compared every table and found
// nothing.
func requireVerifyClean(t *testing.T, env *pgtest.Env) {
	t.Helper()
	rep := verifyOnce(t, verifyConfig(t, env, false))
	for _, vt := range rep.Tables {
		if vt.State != "compared" {
			t.Errorf("verify %s: %s (%s)", vt.Table, vt.State, vt.Reason)
		}
	}
	if rep.Found != 0 || rep.Open != 0 {
		t.Errorf("verify found %d discrepancies (%d open): %+v", rep.Found, rep.Open, rep.Tables)
	}
}

// A column that comes back under a name the target holds is a new column: dropped and added
// again with another type (while streaming, or while the daemon is stopped; with row changes
// between that the daemon may stream before or after it notices), another column renamed onto a
// dropped one's name, a key column created again. The target's column is replaced
// and filled by a reload, never cast from the old values (which do not convert to the new type
// here): the daemon keeps running, the target ends with the source's values and types, coverage
// has no gap and verify finds nothing.
func TestColumnComingBackIsANewColumn(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		// stopped runs drop and add while the daemon is stopped; otherwise, when wait is set,
		// the test waits between them until a session followed the table without that column.
		stopped         bool
		wait            string
		drop, add, then []string
	}{
		"another type while streaming": {wait: "v", drop: []string{`alter table t drop column v`, `insert into t values (51, 51)`},
			add:  []string{`alter table t add column v int`},
			then: []string{`update t set v = id * 10 where id <= 5`, `insert into t values (52, 52, 520)`, `delete from t where id = 10`}},
		"another type while stopped": {stopped: true, drop: []string{`alter table t drop column v`, `insert into t values (51, 51)`},
			add:  []string{`alter table t add column v int default 7`},
			then: []string{`update t set v = id where id <= 5`, `delete from t where id = 10`}},
		"row changes between, the daemon noticing or not": {drop: []string{`alter table t drop column v`, `update t set n = -n where id = 1`},
			add:  []string{`alter table t add column v int`, `update t set v = 5 where id = 2`},
			then: []string{`update t set v = 6 where id = 3`}},
		"renamed onto a dropped name": {drop: []string{`alter table t drop column v`}, add: []string{`alter table t rename column n to v`},
			then: []string{`update t set v = v + 1 where id <= 5`, `delete from t where id = 10`}},
		"key column while stopped": {stopped: true, drop: []string{`alter table t drop column id`},
			add:  []string{`alter table t add column id uuid primary key default gen_random_uuid()`},
			then: []string{`update t set n = -n where n <= 5`, `delete from t where n = 10`}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each case has its own databases and slot
			env := pgtest.New(t)
			d := streamingTable(t, env)
			pgtest.Exec(t, env.Source, `update t set v = 'g2-edited' where id = 2`)
			pgtest.WaitConverged(t, env, "t", "id")
			if c.stopped {
				d.Stop(t)
			}
			pgtest.Exec(t, env.Source, c.drop...)
			if c.wait != "" {
				waitRecordedColumn(t, env, c.wait, false)
			}
			pgtest.Exec(t, env.Source, c.add...)
			if c.stopped {
				d = startDaemon(t, testConfig(t, env))
			}
			pgtest.Exec(t, env.Source, c.then...)
			pgtest.WaitConverged(t, env, "t", "id")
			waitCovered(t, env)
			waitTargetKey(t, env, "id")
			requireVerifyClean(t, env)
			d.RequireRunning(t)
			typeOf := `select attname || ':' || format_type(atttypid, atttypmod) from pg_attribute
where attrelid = 't'::regclass and attnum > 0 and not attisdropped order by attname`
			onTarget := map[string]bool{}
			for _, col := range pgtest.Rows(t, env.Target, typeOf) {
				onTarget[col] = true
			}
			for _, col := range pgtest.Rows(t, env.Source, typeOf) {
				if !onTarget[col] {
					t.Errorf("target table lacks the source's column %s", col)
				}
			}
		})
	}
}

// A column dropped and added again, with the same type or another, with or without a default,
// holds none of the old column's values on the target once the table is brought in line, before
// the reload fills it: until then, rows there hold NULL in it, never a value of the column that
// was dropped. The daemon then loads the source's values.
func TestColumnAddedAgainHoldsNoOldValues(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	d := streamingTable(t, env)
	d.Stop(t)
	pgtest.Exec(t, env.Source, `alter table t drop column n`, `alter table t add column n int`,
		`alter table t drop column v`, `alter table t add column v text default 'new'`)
	tab, err := cdc.DescribeTable(context.Background(), env.Source, "public", "t")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, env)
	if _, err := backfillrun.EnsureTables(context.Background(), env.Source, env.Target, []changebatch.Table{tab}, cfg.Logger); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Scalar[int](t, env.Target, `select count(*) from t where n is not null or v is not null`); got != 0 {
		t.Errorf("%d target rows hold a value of a dropped column before the reload", got)
	}
	d = startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "t", "id")
	waitCovered(t, env)
	requireVerifyClean(t, env)
	d.RequireRunning(t)
}

// A view of the operator's on the target over a column that comes back cannot stay as it is: the
// column is dropped and added again. The session that brings the table in line fails, logged at
// ERROR with the view and the fix, and is retried with backoff: the daemon keeps running, coverage
// reports the table schema-changed, and once the view is dropped the column is replaced and
// loaded again.
func TestColumnComingBackWaitsForAViewOverIt(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	d := streamingTable(t, env)
	pgtest.Exec(t, env.Target, `create view mine as select id, v from t`)
	d.Stop(t)
	pgtest.Exec(t, env.Source, `alter table t drop column v`, `alter table t add column v int`, `update t set v = id where id <= 5`)
	var logs pgtest.SyncBuffer
	cfg := testConfig(t, env)
	cfg.Logger = newTestLogger(t, &logs)
	d = startDaemon(t, cfg)
	pgtest.Eventually(t, 60*time.Second, "the view over the replaced column logged at ERROR with the fix", func() (bool, string) {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=ERROR") && strings.Contains(line, "view mine depends on column") &&
				strings.Contains(line, "public.t") && strings.Contains(line, "drop or change them") {
				return true, ""
			}
		}
		return false, ""
	})
	d.RequireRunning(t)
	if rep, code := coverageOf(t, env); code != exitGap || tableReport(t, rep, "public.t").Status != coverage.SchemaChanged {
		t.Errorf("coverage exit %d, %+v, want %d and schema-changed", code, tableReport(t, rep, "public.t"), exitGap)
	}
	pgtest.Exec(t, env.Target, `drop view mine`)
	pgtest.WaitConverged(t, env, "t", "id")
	waitCovered(t, env)
	requireVerifyClean(t, env)
	d.RequireRunning(t)
}

// On a table without a key, whose copies are identified by their row's hash, a column that comes
// back with another type is replaced and loaded again alike: the multisets end equal.
func TestColumnComingBackOnAKeylessTable(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (a int, b text)`, `alter table t replica identity full`,
		`insert into t select g % 20, 'b' || g from generate_series(1, 100) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	waitSameMultiset(t, env, "t")
	pgtest.Exec(t, env.Source, `alter table t drop column b`)
	waitRecordedColumn(t, env, "b", false)
	pgtest.Exec(t, env.Source, `alter table t add column b int`, `update t set b = a where a < 5`,
		`delete from t where ctid = (select ctid from t where a = 7 limit 1)`)
	waitSameMultiset(t, env, "t")
	waitCovered(t, env)
	requireVerifyClean(t, env)
	d.RequireRunning(t)
}
