package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// waitFiltered polls until the target's live rows of orders equal the source's rows that where
// admits.
func waitFiltered(t *testing.T, env *pgtest.Env, where string) {
	t.Helper()
	pgtest.Eventually(t, 60*time.Second, "target orders equal the source's rows where "+where, func() (bool, string) {
		want := pgtest.Rows(t, env.Source, `select id || ' ' || region || ' ' || amount from orders where `+where+` order by id`)
		got := pgtest.Rows(t, env.Target, `select id || ' ' || region || ' ' || amount from orders where not _cdc_deleted order by id`)
		d := pgtest.Diff(want, got)
		return d == "", d
	})
}

// A publication with a row filter, created by the user, is followed as it filters: the initial
// load, the stream (an UPDATE out of the filter arrives as a DELETE and tombstones the row, one
// into it as an INSERT), a manual backfill and verify all keep exactly the rows it admits;
// coverage says so; a new filter reloads the table under it.
func TestRowFilteredPublicationConverges(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table orders (id int primary key, region text not null, amount int)`,
		// A row filter on a column outside the key needs the old row: REPLICA IDENTITY FULL.
		`alter table orders replica identity full`,
		`insert into orders select g, case when g % 3 = 0 then 'us' else 'eu' end, g * 10 from generate_series(1, 3000) g`,
		`create publication `+env.Name+` for table orders where (region = 'eu')`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	waitFiltered(t, env, "region = 'eu'")
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
	waitFiltered(t, env, "region = 'eu'")
	if !pgtest.Scalar[bool](t, env.Target, `select _cdc_deleted from orders where id = 1`) {
		t.Error("row 1, updated out of the filter, is not a tombstone on the target")
	}

	rep := backfillNow(t, testBackfillConfig(t, env, "public.orders"))
	if rep.Rows != pgtest.Scalar[int64](t, env.Source, `select count(*) from orders where region = 'eu'`) {
		t.Errorf("the backfill read %d rows, want the filter's", rep.Rows)
	}
	waitFiltered(t, env, "region = 'eu'")

	v := verifyOnce(t, verifyConfig(t, env, false, "public.orders"))
	if v.Found != 0 || v.Tables[0].State != "compared" {
		t.Errorf("verify of the filtered table: %+v", v.Tables)
	}
	cov := waitCovered(t, env)
	if len(cov.Tables) != 1 || cov.Tables[0].RowFilter != "(region = 'eu'::text)" {
		t.Errorf("coverage: %+v, want orders covered with its row filter", cov.Tables)
	}

	// A new filter is a membership change: the table is loaded again under it.
	pgtest.Exec(t, env.Source, `alter publication `+env.Name+` set table orders where (region in ('eu', 'us') and amount > 100)`)
	waitFiltered(t, env, "region in ('eu', 'us') and amount > 100")
	pgtest.Exec(t, env.Source, `update orders set amount = 50 where id = 300`) // out of the new filter
	waitFiltered(t, env, "region in ('eu', 'us') and amount > 100")
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
	env := pgtest.New(t)
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
	same := func(cols string) {
		t.Helper()
		pgtest.Eventually(t, 60*time.Second, "target people equal the source's "+cols, func() (bool, string) {
			want := pgtest.Rows(t, env.Source, `select concat_ws(' ', `+cols+`) from people order by id`)
			got := pgtest.Rows(t, env.Target, `select concat_ws(' ', `+cols+`) from people where not _cdc_deleted order by id`)
			d := pgtest.Diff(want, got)
			return d == "", d
		})
	}
	same("id, name, note")
	if c := columnsOf(t, env.Target, "people"); c != "id,name,note" {
		t.Fatalf("target columns %s, want id,name,note", c)
	}
	pgtest.Exec(t, env.Source,
		`update people set ssn = 'changed' where id = 1`, `update people set name = 'renamed' where id = 2`,
		`insert into people (id, name, ssn) values (3001, 'new', 'secret')`, `delete from people where id = 4`,
		`alter table people add column extra int`, // not published: no schema change
		`update people set note = 'after extra', extra = 1 where id = 5`)
	same("id, name, note")
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
	waitCovered(t, env)

	// A narrower list reloads the table; the column left out is kept on the target as a column
	// dropped on the source is (README, "Schema changes"), no longer followed.
	pgtest.Exec(t, env.Source, `alter publication `+env.Name+` set table people (id, name)`)
	pgtest.Eventually(t, 60*time.Second, "a third completed backfill of people (the reload)", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfills where table_name = 'people' and status = 'completed'`)
		return n == 3, fmt.Sprint(n)
	})
	pgtest.Exec(t, env.Source, `update people set name = 'last', note = 'not followed' where id = 6`)
	same("id, name")
	if v := pgtest.Scalar[string](t, env.Target, `select note from people where id = 6`); v != "x6" {
		t.Errorf("note of row 6 on the target %q, want the value from before it left the list (x6)", v)
	}
	if v := verifyOnce(t, verifyConfig(t, env, false, "public.people")); v.Found != 0 {
		t.Errorf("verify after the narrower list: %+v", v.Tables)
	}
	waitCovered(t, env) // the kept column is no schema change
}
