package engine_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// columnsSQL lists a table's or view's columns in order, quoted, comma-separated.
const columnsSQL = `select string_agg(quote_ident(attname), ', ' order by attnum) from pg_attribute
where attrelid = $1::regclass and attnum > 0 and not attisdropped`

// waitLiveView polls until the target's live view holds exactly the source table's columns, in
// order, and its rows (as a multiset: duplicates of a table without a key count).
func waitLiveView(t *testing.T, env *pgtest.Env, table, view string) {
	t.Helper()
	pgtest.Eventually(t, 60*time.Second, view+" equals source "+table, func() (bool, string) {
		srcCols := pgtest.Scalar[string](t, env.Source, columnsSQL, table)
		var viewCols *string
		if err := env.Target.QueryRow(t.Context(), `select case when to_regclass($1) is null then null else (`+columnsSQL+`) end`, view).Scan(&viewCols); err != nil {
			return false, err.Error()
		}
		if viewCols == nil {
			return false, "no view " + view
		}
		if *viewCols != srcCols {
			return false, fmt.Sprintf("view columns %q, source columns %q", *viewCols, srcCols)
		}
		want := pgtest.Rows(t, env.Source, `select row(s.*)::text from `+table+` s order by 1`)
		got := pgtest.Rows(t, env.Target, `select row(v.*)::text from `+view+` v order by 1`)
		d := pgtest.Diff(want, got)
		return d == "", d
	})
}

// The daemon keeps a live view of each target table (public.a: public_live.a) with the source's
// columns, generated ones included, and the rows that are not tombstones, also for a table
// without a key (its duplicates kept); it follows deletes, and column changes that make the
// target table change first (ALTER COLUMN … TYPE), add a column or leave one on the target only,
// and a key added to the table without one (its target table is made anew).
func TestLiveViewsFollowRowsAndColumns(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create type mood as enum ('sad', 'ok')`,
		`create table a (id int primary key, m mood, v text, g int generated always as (id * 2) stored)`,
		`insert into a select i, 'ok', 'v' || i from generate_series(1, 50) i`,
		`create table k (x int, y text)`, `alter table k replica identity full`,
		`insert into k values (1, 'dup'), (1, 'dup'), (2, 'one')`)
	cfg := testConfig(t, env)
	cfg.LiveSuffix = "_live"
	d := startDaemon(t, cfg)
	waitLiveView(t, env, "a", "public_live.a")
	waitLiveView(t, env, "k", "public_live.k")
	pgtest.WaitStreaming(t, env)

	pgtest.Exec(t, env.Source, `delete from a where id <= 5`, `update a set v = 'changed' where id = 10`,
		`delete from k where ctid = (select min(ctid) from k where x = 1)`)
	waitLiveView(t, env, "a", "public_live.a")
	waitLiveView(t, env, "k", "public_live.k")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from a where _cdc_deleted`); n != 5 {
		t.Fatalf("%d tombstones in the target table, want 5 (the view must hide them)", n)
	}

	pgtest.Exec(t, env.Source, `alter table a alter column v type varchar(40)`, `alter table a add column w int default 7`,
		`alter table a drop column m`, `insert into a (id, v) values (100, 'after')`)
	waitLiveView(t, env, "a", "public_live.a")
	// A key makes the table without one a keyed table: its target table is made anew.
	pgtest.Exec(t, env.Source, `alter table k add primary key (x)`, `insert into k values (3, 'keyed')`)
	pgtest.Eventually(t, 60*time.Second, "k made anew as a keyed table", func() (bool, string) {
		keyed := pgtest.Scalar[bool](t, env.Target, `select not exists (select 1 from pg_attribute where attrelid = 'k'::regclass and attname = '_cdc_row_hash')`)
		return keyed, "the target table k still has _cdc_row_hash"
	})
	waitLiveView(t, env, "k", "public_live.k")
	if c := pgtest.Scalar[string](t, env.Target, `select obj_description('public_live.a'::regclass, 'pg_class')`); c == "" {
		t.Error("the live view has no comment marking it pgconverge's")
	}
	d.RequireRunning(t)
}
