package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/backfillrun"

	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// streamingTable creates table t (id int primary key, v text, n int) with 50 rows on the source,
// starts the daemon and waits until it streams.
func streamingTable(t *testing.T, env *pgtest.Env) *pgtest.Running {
	t.Helper()
	pgtest.Exec(t, env.Source, `create table t (id int primary key, v text, n int)`,
		`insert into t select g, 'v' || g, g from generate_series(1, 50) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	return d
}

// targetColumns returns the target table t's columns as name:type, in order.
func targetColumns(t *testing.T, env *pgtest.Env) []string {
	t.Helper()
	return pgtest.Rows(t, env.Target, `select attname || ':' || format_type(atttypid, atttypmod) from pg_attribute
where attrelid = 't'::regclass and attnum > 0 and not attisdropped and attname not like '\_cdc\_%' order by attnum`)
}

// A column added while streaming is added to the target, and rows written after carry it.
func TestAddColumnWhileStreaming(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	streamingTable(t, env)
	pgtest.Exec(t, env.Source, `alter table t add column note varchar(20)`,
		`insert into t values (51, 'v51', 51, 'new')`, `update t set note = 'set' where id = 3`)
	pgtest.WaitConverged(t, env, "t", "id")
	if got := targetColumns(t, env); pgtest.Diff([]string{"id:integer", "v:text", "n:integer", "note:character varying(20)"}, got) != "" {
		t.Errorf("target columns: %q", got)
	}
}

// ADD COLUMN ... DEFAULT fills the existing rows without a change pgoutput sends (a constant is
// stored in the catalog, a volatile default rewrites the table), and no change of the table
// follows here: the daemon still notices the new columns and loads the table again, so the
// existing rows get the source's values, and coverage says covered once that load completed.
func TestAddColumnWithDefaultsFillsExistingRows(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	streamingTable(t, env)
	pgtest.Exec(t, env.Source, `alter table t add column c text not null default 'constant'`,
		`alter table t add column r float8 default random()`)
	pgtest.WaitConverged(t, env, "t", "id")
	waitCovered(t, env)
	if got := pgtest.Scalar[int](t, env.Target, `select count(*) from pgconverge.backfills where table_name = 't' and status = 'completed'`); got != 2 {
		t.Errorf("completed backfills of t: %d, want 2 (the initial load and the reload)", got)
	}
}

// A dropped column stays on the target with the values it had; rows written after leave it NULL.
func TestDropColumnKeepsItOnTheTarget(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	streamingTable(t, env)
	pgtest.Exec(t, env.Source, `alter table t drop column n`, `insert into t values (51, 'v51')`, `update t set v = 'x' where id = 7`)
	pgtest.WaitConverged(t, env, "t", "id")
	got := pgtest.Rows(t, env.Target, `select format('%s %s %s', id, v, coalesce(n::text, 'null')) from t where id in (7, 51) order by id`)
	if d := pgtest.Diff([]string{"7 x 7", "51 v51 null"}, got); d != "" {
		t.Errorf("kept column:\n%s", d)
	}
}

// A renamed column cannot be told from a dropped one and an added one in pgoutput: the target
// gets the new name with the source's values (loaded again), and keeps the old one.
func TestRenameColumnAddsTheNewName(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	streamingTable(t, env)
	pgtest.Exec(t, env.Source, `alter table t rename column v to label`, `update t set label = 'renamed' where id = 1`)
	pgtest.WaitConverged(t, env, "t", "id")
	if got := pgtest.Scalar[int](t, env.Target, `select count(*) from t where v is distinct from label and id > 1`); got != 0 {
		t.Errorf("%d rows whose new column differs from the old one", got)
	}
}

// A column changed to another type is changed on the target and the table is loaded again, so
// values the source's USING expression computed arrive, not the target's cast.
func TestColumnTypeChangeReloadsTheTable(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	streamingTable(t, env)
	pgtest.Exec(t, env.Source, `alter table t alter column n type numeric(12,2) using n * 1.5`)
	pgtest.WaitConverged(t, env, "t", "id")
	pgtest.Exec(t, env.Source, `insert into t values (51, 'v51', 2.25)`)
	pgtest.WaitConverged(t, env, "t", "id")
	if got := targetColumns(t, env); pgtest.Diff([]string{"id:integer", "v:text", "n:numeric(12,2)"}, got) != "" {
		t.Errorf("target columns: %q", got)
	}
}

// A type change whose values the target cannot cast stops the daemon, naming the table and the
// fix, with the target table unchanged; once the target column is changed by hand, the restarted
// daemon loads the table again.
func TestUncastableTypeChangeStopsTheDaemon(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	d := streamingTable(t, env)
	pgtest.Exec(t, env.Source, `alter table t alter column v type int using length(v)`)
	err := d.WaitExit(t, time.Minute)
	for _, want := range []string{"public.t", "v: text -> integer", "ALTER TABLE", "DROP TABLE"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("daemon error %v does not mention %q", err, want)
		}
	}
	if got := targetColumns(t, env); pgtest.Diff([]string{"id:integer", "v:text", "n:integer"}, got) != "" {
		t.Errorf("target columns: %q", got)
	}
	pgtest.Exec(t, env.Target, `alter table t alter column v type int using 0`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "t", "id")
}

// A key redefined while streaming is followed: the transaction that first streams under the new
// key is not applied under the old one; the target table takes the new key (its tombstones, which
// carry only the old key, go) and is loaded again under it; streaming goes on, and changes of the
// new key (updates of its columns, deletes that send only it) converge. So does a switch of
// REPLICA IDENTITY USING INDEX to another unique index.
func TestKeyChangeIsFollowed(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	d := streamingTable(t, env)
	pgtest.Exec(t, env.Source, `delete from t where id = 50`) // a tombstone of the old key
	pgtest.WaitConverged(t, env, "t", "id")
	pgtest.Exec(t, env.Source, `alter table t drop constraint t_pkey`, `alter table t add primary key (n)`,
		`update t set n = n + 1000 where id <= 10`, `delete from t where id = 20`, `insert into t values (51, 'new', 51)`)
	pgtest.WaitConverged(t, env, "t", "n")
	waitTargetKey(t, env, "n")
	pgtest.Exec(t, env.Source, `create unique index t_v on t (v)`, `alter table t alter column v set not null`,
		`alter table t replica identity using index t_v`,
		`update t set v = v || '!' where n > 1040`, `delete from t where n = 30`)
	pgtest.WaitConverged(t, env, "t", "n")
	waitTargetKey(t, env, "v")
	waitCovered(t, env)
	d.RequireRunning(t)
}

// waitTargetKey polls until the target table t's primary key is exactly the column col.
func waitTargetKey(t *testing.T, env *pgtest.Env, col string) {
	t.Helper()
	pgtest.Eventually(t, 60*time.Second, "target key ("+col+")", func() (bool, string) {
		key := pgtest.Rows(t, env.Target, `select a.attname::text from pg_index i join pg_attribute a on a.attrelid = i.indrelid and a.attnum = any (i.indkey::int2[])
where i.indrelid = 't'::regclass and i.indisprimary order by a.attname`)
		return fmt.Sprint(key) == "["+col+"]", fmt.Sprint(key)
	})
}

// Generated columns, which pgoutput does not send, are generated columns of the target table
// too, with the source's values on both paths; one added while streaming is added there, and
// one whose expression the source dropped becomes a plain column that the stream writes.
func TestGeneratedColumnsFollowTheSource(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key, a int, b text,
  g int generated always as (a * 2) stored, h text generated always as (upper(b) || '!') stored)`,
		`insert into t (id, a, b) values (1, 1, 'x'), (2, 2, null)`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `insert into t (id, a, b) values (3, 3, 'y')`, `update t set a = 10 where id = 1`)
	pgtest.WaitConvergedColumns(t, env, "t", "id, a, b, g, h", "id")
	pgtest.Exec(t, env.Source, `alter table t add column k bigint generated always as (id * 1000 + a) stored`)
	pgtest.WaitConvergedColumns(t, env, "t", "id, a, b, g, h, k", "id")
	pgtest.Exec(t, env.Source, `alter table t alter column g drop expression`, `update t set g = -1 where id = 2`)
	pgtest.WaitConvergedColumns(t, env, "t", "id, a, b, g, h, k", "id")
	got := pgtest.Rows(t, env.Target, `select attname || ':' || attgenerated::text from pg_attribute
where attrelid = 't'::regclass and attname in ('g', 'h', 'k') order by attname`)
	if d := pgtest.Diff([]string{"g:", "h:s", "k:s"}, got); d != "" {
		t.Errorf("target generated columns:\n%s", d)
	}
}

// A column added while the daemon is stopped is added by the next start, which records the
// change: until a backfill read after it completes, coverage reports the table schema-changed and
// exits 3; the daemon then loads it again and coverage is clean.
func TestSchemaChangeIsNotCoveredUntilReloaded(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	d := streamingTable(t, env)
	d.Stop(t)
	pgtest.Exec(t, env.Source, `alter table t add column c int not null default 7`)
	tab, err := cdc.DescribeTable(context.Background(), env.Source, "public", "t")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, env)
	if _, err := backfillrun.EnsureTables(context.Background(), env.Source, env.Target, []changebatch.Table{tab}, cfg.Logger); err != nil {
		t.Fatal(err)
	}
	rep, code := coverageOf(t, env)
	if tr := tableReport(t, rep, "public.t"); code != 3 || tr.Status != coverage.SchemaChanged {
		t.Fatalf("coverage exit %d, status %s (%s), want 3 and schema-changed", code, tr.Status, tr.Note)
	}
	startDaemon(t, cfg)
	waitCovered(t, env)
	pgtest.WaitConverged(t, env, "t", "id")
}

// waitRecordedColumn polls until the ledger's recorded source shape of table t has (or lacks,
// when has is false) column col: a session started since the source changed.
func waitRecordedColumn(t *testing.T, env *pgtest.Env, col string, has bool) {
	t.Helper()
	pgtest.Eventually(t, 60*time.Second, fmt.Sprintf("recorded shape has column %s: %v", col, has), func() (bool, string) {
		got := pgtest.Scalar[bool](t, env.Target, `select coalesce(source_shape->'columns' ? $1, false) from pgconverge.tables where table_name = 't'`, col)
		return got == has, fmt.Sprint(got)
	})
}

// A column dropped and then added again under the same name and type holds new values on the
// source (its default): the target's kept column is loaded again, never left stale.
func TestColumnAddedAgainUnderItsNameIsReloaded(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	streamingTable(t, env)
	pgtest.Exec(t, env.Source, `alter table t drop column n`, `insert into t values (51, 'v51')`)
	waitRecordedColumn(t, env, "n", false)
	pgtest.Exec(t, env.Source, `alter table t add column n int default 42`)
	pgtest.WaitConverged(t, env, "t", "id")
	waitCovered(t, env)
}

// A column renamed and renamed back: the changes written under the other name reach the column.
func TestColumnRenamedBackIsReloaded(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	streamingTable(t, env)
	pgtest.Exec(t, env.Source, `alter table t rename column v to w`, `update t set w = 'changed' where id <= 5`)
	waitRecordedColumn(t, env, "w", true)
	pgtest.Exec(t, env.Source, `alter table t rename column w to v`)
	pgtest.WaitConverged(t, env, "t", "id")
}

// Rewrites that keep every column's name and type still change values with no change pgoutput
// sends, and reach the target: a type change to the same type with USING, and a change made and
// undone within one transaction with row changes in between (streamed against columns the
// description never had).
func TestRewritesKeepingTheColumnsAreReloaded(t *testing.T) {
	t.Parallel()
	for name, ddl := range map[string]string{
		"same type using": `alter table t alter column n type int using n * 2`,
		"type round trip": `begin; alter table t alter column n type bigint; update t set n = 999 where id = 1;
alter table t alter column n type int; commit`,
		"rename round trip": `begin; alter table t rename column v to w; update t set w = 'new name' where id = 1;
insert into t values (51, 'inserted', 51); alter table t rename column w to v; commit`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each case has its own databases and slot
			env := pgtest.New(t)
			streamingTable(t, env)
			pgtest.Exec(t, env.Source, ddl)
			pgtest.WaitConverged(t, env, "t", "id")
			waitCovered(t, env)
			if got := pgtest.Scalar[int](t, env.Target, `select count(*) from t where _cdc_unknown is not null and not _cdc_deleted`); got != 0 {
				t.Errorf("%d live rows with unknown columns", got)
			}
		})
	}
}

// A generated column dropped and added again with another expression, or changed to another
// type, is created again on the target with the source's.
func TestGeneratedColumnRecreatedOnTheTarget(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key, a int, g int generated always as (a * 2) stored,
  f float8 generated always as (a / 3.0) stored)`, `insert into t (id, a) select x, x from generate_series(1, 20) x`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `alter table t drop column g`)
	waitRecordedColumn(t, env, "g", false)
	pgtest.Exec(t, env.Source, `alter table t add column g int generated always as (a * 3) stored`, `alter table t alter column f type int`)
	pgtest.WaitConvergedColumns(t, env, "t", "id, a, g, f", "id")
}

// Enum labels renamed on the source are renamed on the target, which changes the rows holding
// them: also when names are swapped or a renamed label's old name is added again (labels are
// followed by their oids, not their names).
func TestEnumLabelsRenamedOnTheTarget(t *testing.T) {
	t.Parallel()
	for name, ddl := range map[string][]string{
		"rename": {`alter type mood rename value 'b' to 'blue'`},
		"swap": {`alter type mood rename value 'b' to 'tmp'`, `alter type mood rename value 'c' to 'b'`,
			`alter type mood rename value 'tmp' to 'c'`},
		"old name added again": {`alter type mood rename value 'b' to 'x'`, `alter type mood add value 'b' after 'x'`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each case has its own databases and slot
			env := pgtest.New(t)
			pgtest.Exec(t, env.Source, `create type mood as enum ('a', 'b', 'c', 'd')`, `create table t (id int primary key, m mood)`,
				`insert into t select g, (array['a', 'b', 'c', 'd'])[g % 4 + 1]::mood from generate_series(1, 20) g`)
			startDaemon(t, testConfig(t, env))
			pgtest.WaitStreaming(t, env)
			pgtest.Exec(t, env.Source, ddl...)
			pgtest.WaitConverged(t, env, "t", "id")
			order := `select string_agg(enumlabel, ',' order by enumsortorder) from pg_enum where enumtypid = 'mood'::regtype`
			if src, tgt := pgtest.Scalar[string](t, env.Source, order), pgtest.Scalar[string](t, env.Target, order); src != tgt {
				t.Errorf("enum labels: source %s, target %s", src, tgt)
			}
		})
	}
}

// The report compares the source table with the shape the stream last followed: a rewrite is
// schema-changed at once, before the daemon notices it (here: while it is stopped).
func TestCoverageSeesARewriteBeforeTheDaemon(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	d := streamingTable(t, env)
	d.Stop(t)
	pgtest.Exec(t, env.Source, `alter table t alter column n type int using n * 2`)
	rep, code := coverageOf(t, env)
	if tr := tableReport(t, rep, "public.t"); code != 3 || tr.Status != coverage.SchemaChanged || !strings.Contains(tr.Note, "table rewritten") {
		t.Fatalf("coverage exit %d, status %s (%s), want 3, schema-changed and the rewrite", code, tr.Status, tr.Note)
	}
	startDaemon(t, testConfig(t, env))
	waitCovered(t, env)
	pgtest.WaitConverged(t, env, "t", "id")
}
