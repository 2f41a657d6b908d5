package engine

import (
	"testing"
	"time"

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
