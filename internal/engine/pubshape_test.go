package engine_test

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// waitSameRows polls until the target's live rows of table equal the source's rows that where
// admits, compared by cols (a select list; the values joined by spaces, NULLs left out), in id
// order.
func waitSameRows(t *testing.T, env *pgtest.Env, table, cols, where string) {
	t.Helper()
	pgtest.Eventually(t, 60*time.Second, table+" ("+cols+") equal on the target to the source's rows where "+where, func() (bool, string) {
		want := pgtest.Rows(t, env.Source, `select concat_ws(' ', `+cols+`) from `+table+` where `+where+` order by id`)
		got := pgtest.Rows(t, env.Target, `select concat_ws(' ', `+cols+`) from `+table+` where not _cdc_deleted order by id`)
		d := pgtest.Diff(want, got)
		return d == "", d
	})
}

// A publication with a row filter, created by the user, is followed as it filters: the initial
// load, the stream (an UPDATE out of the filter arrives as a DELETE and tombstones the row, one
// into it as an INSERT), a manual backfill and verify all keep exactly the rows it admits;
// coverage says so; a new filter reloads the table under it.
func TestRowFilteredPublicationConverges(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 15, "row filters, column lists and schema publications")
	pgtest.Exec(t, env.Source,
		`create table orders (id int primary key, region text not null, amount int)`,
		// A row filter on a column outside the key needs the old row: REPLICA IDENTITY FULL.
		`alter table orders replica identity full`,
		`insert into orders select g, case when g % 3 = 0 then 'us' else 'eu' end, g * 10 from generate_series(1, 3000) g`,
		`create publication `+env.Name+` for table orders where (region = 'eu')`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	waitSameRows(t, env, "orders", "id, region, amount", "region = 'eu'")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from orders where region <> 'eu'`); n != 0 {
		t.Fatalf("the initial load wrote %d rows outside the filter", n)
	}

	pgtest.Exec(t, env.Source,
		`insert into orders values (5001, 'eu', 1), (5002, 'us', 2)`,
		`update orders set region = 'eu' where id = 3`, // into the filter
		`update orders set region = 'us' where id = 1`, // out of the filter
		`update orders set amount = -4 where id = 4`,   // within it
		`delete from orders where id in (5, 6)`,        // one in, one out
		`update orders set amount = amount + 1 where id <= 100`)
	waitSameRows(t, env, "orders", "id, region, amount", "region = 'eu'")
	if !pgtest.Scalar[bool](t, env.Target, `select _cdc_deleted from orders where id = 1`) {
		t.Error("row 1, updated out of the filter, is not a tombstone on the target")
	}

	rep := backfillNow(t, testBackfillConfig(t, env, "public.orders"))
	if rep.Rows != pgtest.Scalar[int64](t, env.Source, `select count(*) from orders where region = 'eu'`) {
		t.Errorf("the backfill read %d rows, want the filter's", rep.Rows)
	}
	waitSameRows(t, env, "orders", "id, region, amount", "region = 'eu'")

	v := verifyOnce(t, verifyConfig(t, env, false, "public.orders"))
	if v.Found != 0 || v.Tables[0].State != "compared" {
		t.Errorf("verify of the filtered table: %+v", v.Tables)
	}
	cov := waitCovered(t, env)
	if len(cov.Tables) != 1 || cov.Tables[0].RowFilter != "(region = 'eu'::text)" {
		t.Errorf("coverage: %+v, want orders covered with its row filter", cov.Tables)
	}

	// A new filter is a membership change: the table is loaded again under it.
	// A filter holding a % (a LIKE pattern, a modulo) is SQL text, never a format string.
	const filter = "region in ('eu', 'us') and amount > 100 and region like '%u%' and id % 7 <> 0"
	pgtest.Exec(t, env.Source, `alter publication `+env.Name+` set table orders where (`+filter+`)`)
	waitSameRows(t, env, "orders", "id, region, amount", filter)
	pgtest.Exec(t, env.Source, `update orders set amount = 50 where id = 300`) // out of the new filter
	waitSameRows(t, env, "orders", "id, region, amount", filter)
}

// columnsOf returns the non-metadata columns of table on conn, in order.
func columnsOf(t *testing.T, conn *pgx.Conn, table string) string {
	t.Helper()
	return pgtest.Scalar[string](t, conn, `select string_agg(column_name, ',' order by ordinal_position) from information_schema.columns
where table_schema = 'public' and table_name = $1 and column_name not like '\_cdc\_%'`, table)
}

// A publication with a column list is followed as it publishes: the target table has only the
// listed columns, changes of the others are not schema changes, every read takes only the listed
// ones, and a narrower list reloads the table without the columns it left out. A list without a
// key column is refused.
func TestColumnListPublicationConverges(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 15, "row filters, column lists and schema publications")
	pgtest.Exec(t, env.Source,
		`create table people (id int primary key, name text, ssn text, note text, twice int generated always as (id * 2) stored)`,
		`insert into people (id, name, ssn, note) select g, 'n' || g, 's' || g, 'x' || g from generate_series(1, 2000) g`,
		`create publication keyless_`+env.Name+` for table people (name, note)`,
		`create publication `+env.Name+` for table people (id, name, note)`)
	cfg := testConfig(t, env)
	cfg.Publication = "keyless_" + env.Name
	requireRefusal(t, cfg, "leaves out key column \"id\"", "ALTER PUBLICATION")
	// PostgreSQL itself refuses the source's UPDATEs while such a publication exists.
	pgtest.Exec(t, env.Source, `drop publication keyless_`+env.Name)

	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	waitSameRows(t, env, "people", "id, name, note", "true")
	if c := columnsOf(t, env.Target, "people"); c != "id,name,note" {
		t.Fatalf("target columns %s, want id,name,note", c)
	}
	pgtest.Exec(t, env.Source,
		`update people set ssn = 'changed' where id = 1`, `update people set name = 'renamed' where id = 2`,
		`insert into people (id, name, ssn) values (3001, 'new', 'secret')`, `delete from people where id = 4`,
		`alter table people add column extra int`, // not published: no schema change
		`update people set note = 'after extra', extra = 1 where id = 5`)
	waitSameRows(t, env, "people", "id, name, note", "true")
	rep := backfillNow(t, testBackfillConfig(t, env, "public.people"))
	if rep.Rows != 2000 {
		t.Errorf("the backfill read %d rows, want 2000", rep.Rows)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfills where table_name = 'people' and status = 'completed'`); n != 2 {
		t.Errorf("%d completed backfills of people, want 2 (the initial load and the manual one): a column outside the list reloaded it", n)
	}
	if v := verifyOnce(t, verifyConfig(t, env, false, "public.people")); v.Found != 0 || v.Tables[0].State != "compared" {
		t.Errorf("verify of the listed columns: %+v", v.Tables)
	}
	if cov := waitCovered(t, env); fmt.Sprint(cov.Tables[0].ColumnList) != "[id name note]" {
		t.Errorf("coverage's column list %v, want [id name note]", cov.Tables[0].ColumnList)
	}

	// A narrower list reloads the table; the column left out is kept on the target as a column
	// dropped on the source is (docs/schema-changes.md), no longer followed.
	pgtest.Exec(t, env.Source, `alter publication `+env.Name+` set table people (id, name)`)
	pgtest.Eventually(t, 60*time.Second, "a third completed backfill of people (the reload)", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfills where table_name = 'people' and status = 'completed'`)
		return n == 3, fmt.Sprint(n)
	})
	pgtest.Exec(t, env.Source, `update people set name = 'last', note = 'not followed' where id = 6`)
	waitSameRows(t, env, "people", "id, name", "true")
	if v := pgtest.Scalar[string](t, env.Target, `select note from people where id = 6`); v != "x6" {
		t.Errorf("note of row 6 on the target %q, want the value from before it left the list (x6)", v)
	}
	if v := verifyOnce(t, verifyConfig(t, env, false, "public.people")); v.Found != 0 {
		t.Errorf("verify after the narrower list: %+v", v.Tables)
	}
	waitCovered(t, env) // the kept column is no schema change
}

// A table published both by its own row (with a row filter) and through its schema publishes
// the schema's rows, all of them: the schema leaving the publication, or coming into it, changes
// the rows published and reloads the table.
func TestSchemaAndFilteredTableInOnePublication(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 15, "row filters, column lists and schema publications")
	pgtest.Exec(t, env.Source, `create schema s`,
		`create table s.t (id int primary key, v int)`, `create table public.u (id int primary key, v int)`,
		`insert into s.t select g, g from generate_series(1, 100) g`, `insert into public.u select g, g from generate_series(1, 100) g`,
		`create publication `+env.Name+` for tables in schema s, table s.t where (id > 50), table public.u where (id > 50)`)
	startDaemon(t, testConfig(t, env)) // the default selection: the publication's tables
	pgtest.WaitStreaming(t, env)
	waitSameRows(t, env, "s.t", "id, v", "true")
	waitSameRows(t, env, "public.u", "id, v", "id > 50")
	pgtest.Exec(t, env.Source, `alter publication `+env.Name+` drop tables in schema s`)
	waitSameRows(t, env, "s.t", "id, v", "id > 50")
	pgtest.Exec(t, env.Source, `alter publication `+env.Name+` add tables in schema public`)
	waitSameRows(t, env, "public.u", "id, v", "true")
	pgtest.Exec(t, env.Source, `update s.t set v = -v where id in (10, 60)`, `update public.u set v = -v where id in (10, 60)`)
	waitSameRows(t, env, "s.t", "id, v", "id > 50")
	waitSameRows(t, env, "public.u", "id, v", "true")
}

// With --on-gap=alert a new filter is only reported; the manual backfill the daemon's error names
// reads through the new filter, though the table, marked not loaded, no longer names its slot.
func TestManualBackfillAfterFilterChangeUnderAlert(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 15, "row filters, column lists and schema publications")
	pgtest.Exec(t, env.Source, `create table u (id int primary key, v int)`,
		`insert into u select g, g from generate_series(1, 100) g`,
		`create publication `+env.Name+` for table u where (id <= 50)`)
	cfg := testConfig(t, env)
	cfg.OnGap = OnGapAlert
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	waitSameRows(t, env, "u", "id, v", "id <= 50")
	pgtest.Exec(t, env.Source, `alter publication `+env.Name+` set table u where (id > 80)`)
	pgtest.Eventually(t, 60*time.Second, "u marked not loaded", func() (bool, string) {
		ok := pgtest.Scalar[bool](t, env.Target, `select loaded_lsn is null from pgconverge.tables where table_name = 'u'`)
		return ok, "still loaded"
	})
	rep := backfillNow(t, testBackfillConfig(t, env, "public.u"))
	if rep.Rows != 20 {
		t.Errorf("the backfill read %d rows, want the new filter's 20", rep.Rows)
	}
	waitSameRows(t, env, "u", "id, v", "id > 80")
}

// An UPDATE that moves a row into the row filter arrives as an INSERT, and PostgreSQL keeps the
// "unchanged TOAST" marker of a value it did not detoast: the target cannot know that value. The
// daemon says so, naming the table, and fills the value from a fresh snapshot at once.
func TestToastedRowMovedIntoFilterIsFilled(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 15, "row filters, column lists and schema publications")
	pgtest.Exec(t, env.Source, `create table k (id int primary key, big text, v int)`,
		`alter table k alter big set storage external`,
		`insert into k select g, repeat(md5(g::text), 400), g from generate_series(1, 20) g`,
		`create publication `+env.Name+` for table k where (id > 10)`)
	logs := &pgtest.SyncBuffer{}
	cfg := testConfig(t, env)
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(logs, pgtest.LogWriter(t)), nil))
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `update k set id = id + 1000 where id in (1, 2)`)
	pgtest.Eventually(t, 30*time.Second, "rows 1001 and 1002 with their TOASTed values", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from k where id in (1001, 1002) and not _cdc_deleted
  and big = repeat(md5((id - 1000)::text), 400) and _cdc_unknown is null`)
		return n == 2, fmt.Sprint(n)
	})
	// The filler logs after its transaction commits, so the rows can be seen a moment before.
	pgtest.Eventually(t, 10*time.Second, "the fill logged", func() (bool, string) {
		return strings.Contains(logs.String(), "filled target values"), "not yet"
	})
	l := logs.String()
	for _, w := range []string{"without some TOASTed values", "table=public.k rows=2", "filled target values"} {
		if !strings.Contains(l, w) {
			t.Errorf("the log does not say %q", w)
		}
	}
	if rep := verifyOnce(t, verifyConfig(t, env, false, "public.k")); rep.Found != 0 {
		t.Errorf("verify after the fill: %+v", rep.Tables)
	}
}

// An interrupted manual backfill is not resumed through another row filter: the chunks it kept
// hold the old filter's rows.
func TestBackfillIsNotResumedThroughAnotherFilter(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 15, "row filters, column lists and schema publications")
	pgtest.Exec(t, env.Source, `create table big (id bigint primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`,
		`create publication `+env.Name+` for table big where (id <= 15000)`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	d.Stop(t)
	out, err := crashChildCmd(env, "backfill-chunk", 5).CombinedOutput()
	requireKilled(t, err, out)
	pgtest.Exec(t, env.Source, `alter publication `+env.Name+` set table big where (id > 10000)`)
	rep := backfillNow(t, testBackfillConfig(t, env, "public.big"))
	if rep.Kept != 0 || rep.Rows != 10000 {
		t.Errorf("kept %d rows and read %d, want 0 and 10000 (nothing resumed through the old filter)", rep.Kept, rep.Rows)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from big where not _cdc_deleted and id <= 10000`); n != 0 {
		t.Errorf("%d live target rows outside the new filter", n)
	}
}
