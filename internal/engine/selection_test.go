package engine_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/operator"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// A table left out of --tables for a while misses changes: coverage reports it not-streamed and
// fails until it is retired (a table a stream follows, or one the ledger does not know, is not);
// selected again, it is followed and loaded again.
func TestTableLeftOutAndSelectedAgainIsReloaded(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table a (id int primary key, v text)`, `create table b (id int primary key, v text)`,
		`insert into a values (1, 'a1')`, `insert into b values (1, 'b1')`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitConverged(t, env, "b", "id")
	d.Stop(t)

	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.a"}
	d = startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `insert into a values (2, 'a2')`, `insert into b values (2, 'missed while left out')`)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitSlotCaughtUp(t, env)
	rep, code := coverageOf(t, env)
	if b := tableReport(t, rep, "public.b"); code != exitGap || b.Status != coverage.NotStreamed || rep.Covered {
		t.Errorf("exit %d, covered %v, b %+v: want exit %d and b not-streamed while it is left out", code, rep.Covered, b, exitGap)
	}
	_, err := operator.Retire(context.Background(), operator.RetireConfig{Target: env.TargetURL, Tables: []string{"public.a, public.b", "public.nope"}})
	if !errors.Is(err, coverage.ErrStillFollowed) || !strings.Contains(err.Error(), "public.a") || !strings.Contains(err.Error(), "public.nope is not in the target's ledger") {
		t.Errorf("retire of a followed, a left-out and an unknown table: %v; want public.a still followed and public.nope unknown", err)
	}
	if rep, code := coverageOf(t, env); code != exitGap {
		t.Errorf("a refused retire retired something: exit %d, %+v", code, rep.Tables)
	}
	retired, err := operator.Retire(context.Background(), operator.RetireConfig{Target: env.TargetURL, Tables: []string{"public.b"}})
	if err != nil || len(retired) != 1 {
		t.Fatalf("retire public.b: %v, %v", retired, err)
	}
	rep, code = coverageOf(t, env)
	if b := tableReport(t, rep, "public.b"); code != 0 || b.Status != coverage.Retired || b.RetiredAt == nil || !rep.Covered {
		t.Errorf("exit %d, b %+v: want exit 0 and b retired", code, b)
	}
	d.Stop(t)

	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.WaitConverged(t, env, "a", "id")
	if b := tableReport(t, waitCovered(t, env), "public.b"); b.Status != coverage.Covered {
		t.Errorf("b selected again: %+v, want covered", b)
	}
}

// loadedAndStopped starts the daemon on a source table a of 100 rows, waits until the target
// holds it, and stops the daemon.
func loadedAndStopped(t *testing.T) *pgtest.Env {
	t.Helper()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`,
		`insert into a select g, 'v' || g from generate_series(1, 100) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	d.Stop(t)
	return env
}

// A target table dropped by hand is recreated and loaded again, never left empty.
func TestDroppedTargetTableIsReloaded(t *testing.T) {
	t.Parallel()
	env := loadedAndStopped(t)
	pgtest.Exec(t, env.Target, `drop table a`)
	pgtest.Exec(t, env.Source, `update a set v = 'changed' where id <= 10`)
	rep, code := coverageOf(t, env)
	if a := tableReport(t, rep, "public.a"); code != exitGap || a.Status != "never-loaded" || len(a.Gaps) != 1 || a.Gaps[0].FromLSN != 0 {
		t.Fatalf("exit %d, %+v: want exit 3, never-loaded, one gap from 0/0", code, a)
	}
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
}

// A target table replaced by hand (dropped and created again with the same columns) is a new
// target table: nothing loaded or streamed before is in it, so it is loaded again.
func TestTargetTableReplacedByHandIsReloaded(t *testing.T) {
	t.Parallel()
	env := loadedAndStopped(t)
	pgtest.Exec(t, env.Target, `create table a2 (like a including all)`, `drop table a`, `alter table a2 rename to a`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	if g := pgtest.Scalar[int32](t, env.Target, `select generation from pgconverge.tables where table_name = 'a'`); g != 2 {
		t.Errorf("generation %d, want 2", g)
	}
}

func TestRefusesTargetThatIsTheSourceUnderAnotherName(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`)
	u, err := url.Parse(env.SourceURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = strings.Replace(u.Host, "127.0.0.1", "localhost", 1)
	cfg := testConfig(t, env)
	cfg.Target = u.String()
	requireRefusal(t, cfg, "same database")
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_namespace where nspname = 'pgconverge'`); n != 0 {
		t.Error("pgconverge wrote its metadata schema into the source")
	}
}

func TestRefusesRoleThatCannotReadTheTable(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	role := env.Name + "_weak"
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`,
		`create role `+role+` login replication`,
		`grant create on database `+env.Name+` to `+role)
	t.Cleanup(func() {
		pgtest.Exec(t, env.Source, `drop owned by `+role, `drop role `+role)
	})
	u, err := url.Parse(env.SourceURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	cfg := testConfig(t, env)
	cfg.Source = u.String()
	cfg.Tables = []string{"a"}
	requireRefusal(t, cfg, "may not read table public.a", "GRANT SELECT")
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where slot_name = $1`, env.Name); n != 0 {
		t.Error("a slot was created despite the refusal")
	}
}

// An existing publication that hides operations, rows or columns is refused, not trusted.
func TestRefusesPublicationThatHidesChanges(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table a (id int primary key, v text, secret text)`,
		`create publication no_deletes for table a with (publish = 'insert, update')`)
	cases := map[string]string{
		"no_deletes": "does not publish every operation",
	}
	for pub, want := range cases {
		cfg := testConfig(t, env)
		cfg.Publication = pub
		t.Run(pub, func(t *testing.T) { requireRefusal(t, cfg, want) })
	}
}

// PostgreSQL 18 can publish stored generated columns (publish_generated_columns = stored, or a
// column list that names one); pgconverge computes them on the target instead, so such a
// publication is refused, naming the fix.
func TestPublishedGeneratedColumnsAreRefused(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 18, "publications that publish generated columns")
	pgtest.Exec(t, env.Source, `create table g (id int primary key, v int, w int generated always as (v * 2) stored)`,
		`create publication gen_all for table g with (publish_generated_columns = stored)`,
		`create publication gen_listed for table g (id, v, w)`)
	cases := map[string][]string{
		"gen_all":    {"publish_generated_columns = stored", "publish_generated_columns = none"},
		"gen_listed": {`generated column "w"`, "leave the column out of the table's column list"},
	}
	for pub, want := range cases {
		cfg := testConfig(t, env)
		cfg.Publication = pub
		t.Run(pub, func(t *testing.T) { requireRefusal(t, cfg, want...) })
	}
}

// A table removed from the publication and added back while streaming missed changes in between:
// the daemon notices the new membership and loads the table again.
func TestPublicationDropAndReAddWhileStreaming(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table a (id int primary key, v text)`, `create table b (id int primary key, v text)`,
		`insert into b select g, 'v' || g from generate_series(1, 100) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.WaitStreaming(t, env)
	pub := `"` + env.Name + `"`
	pgtest.Exec(t, env.Source,
		`alter publication `+pub+` drop table b`,
		`delete from b where id > 90`, `update b set v = 'missed' where id <= 5`,
		`alter publication `+pub+` add table b`,
		`insert into b values (1000, 'after')`, `insert into a values (1, 'a')`)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitConverged(t, env, "b", "id")
	d.RequireRunning(t)
	// The ledger ended b's span where its membership was last confirmed; the gap backfill closed it.
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.table_spans
where table_name = 'b' and end_reason = 'publication membership changed'`); n != 1 {
		t.Errorf("%d spans of b ended by the membership change, want 1", n)
	}
	waitCovered(t, env)
}

// While the daemon is stopped a row is inserted, the table leaves the publication, the row is
// deleted and the table comes back: the reload must not let the replayed insert resurrect it.
func TestReloadFencesOlderStreamChanges(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table b (id int primary key, v text)`,
		`insert into b select g, 'v' || g from generate_series(1, 10) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.WaitSlotCaughtUp(t, env)
	d.Stop(t)
	pub := `"` + env.Name + `"`
	pgtest.Exec(t, env.Source,
		`insert into b values (500, 'gone before the reload')`,
		`alter publication `+pub+` drop table b`,
		`delete from b where id = 500`,
		`alter publication `+pub+` add table b`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitSlotCaughtUp(t, env)
	pgtest.WaitConverged(t, env, "b", "id")
}

// Deletes are not published for a while: the publication's new row version is noticed and the
// table is loaded again.
func TestPublishOptionChangedWhileStreaming(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table b (id int primary key, v text)`,
		`insert into b select g, 'v' || g from generate_series(1, 100) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.WaitStreaming(t, env)
	pub := `"` + env.Name + `"`
	pgtest.Exec(t, env.Source,
		`alter publication `+pub+` set (publish = 'insert, update')`,
		`delete from b where id > 90`,
		`alter publication `+pub+` set (publish = 'insert, update, delete, truncate')`,
		`insert into b values (1000, 'after')`)
	pgtest.WaitConverged(t, env, "b", "id")
	d.RequireRunning(t)
}

// Without --tables the selection is the publication's tables: a table dropped from it and added
// back while the daemon runs is followed again, its missed changes backfilled.
func TestDefaultSelectionFollowsThePublication(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pub := `"` + env.Name + `"`
	pgtest.Exec(t, env.Source,
		`create table a (id int primary key, v text)`, `create table b (id int primary key, v text)`,
		`insert into b select g, 'v' from generate_series(1, 100) g`, `create publication `+pub+` for table a, b`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `alter publication `+pub+` drop table b`)
	pgtest.Eventually(t, 30*time.Second, "b no longer streamed", func() (bool, string) {
		rep, _ := coverageOf(t, env)
		b := tableReport(t, rep, "public.b")
		return b.Status == "not-streamed", string(b.Status)
	})
	pgtest.Exec(t, env.Source, `update b set v = 'missed' where id <= 50`,
		`alter publication `+pub+` add table b`, `insert into b values (1000, 'after')`)
	pgtest.WaitConverged(t, env, "b", "id")
	waitCovered(t, env)
	d.RequireRunning(t)
}

// With a publication of a whole schema, a table moved out of the schema and back, or made
// unlogged and logged again, was not published in between although no publication row changed:
// the daemon notices (the table's catalog row changed) and loads it again.
func TestSchemaPublicationRoundTripsAreNoticed(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 15, "row filters, column lists and schema publications")
	pub := `"` + env.Name + `"`
	pgtest.Exec(t, env.Source, `create schema other`,
		`create table a (id int primary key, v text)`, `insert into a select g, 'v' from generate_series(1, 100) g`,
		`create publication `+pub+` for tables in schema public`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `begin`, `alter table a set schema other`,
		`update other.a set v = 'missed' where id <= 10`, `alter table other.a set schema public`, `commit`,
		`alter table a set unlogged`, `delete from a where id > 90`, `alter table a set logged`)
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	d.RequireRunning(t)
}

// A table renamed, or moved to another schema, and back while streaming stays published (its
// publication row is the same); the stream matches its changes by the table's oid, so the changes
// made under the other name reach the target.
func TestRenameRoundTripsKeepTheirChanges(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create schema other`,
		`create table a (id int primary key, v text)`, `insert into a select g, 'v' from generate_series(1, 100) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `alter table a rename to a_old`,
		`update a_old set v = 'renamed' where id <= 10`, `delete from a_old where id > 95`, `insert into a_old values (500, 'new')`,
		`alter table a_old rename to a`,
		`alter table a set schema other`, `update other.a set v = 'moved' where id between 11 and 20`, `alter table other.a set schema public`)
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	d.RequireRunning(t)
}

// A source table dropped while the daemon was stopped may have changes before its DROP that no
// stream delivers any more: it is reported not-streamed (a failing check), never retired by the
// daemon itself; the operator retires it.
func TestDroppedSourceTableWaitsForTheOperator(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `create table x (id int primary key, v text)`,
		`insert into x select g, 'v' from generate_series(1, 10) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "x", "id")
	d.Stop(t)
	pgtest.Exec(t, env.Source, `update x set v = 'before the drop' where id <= 5`, `drop table x`)
	d = startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.Eventually(t, 60*time.Second, "x not-streamed", func() (bool, string) {
		rep, code := coverageOf(t, env)
		x := tableReport(t, rep, "public.x")
		return x.Status == coverage.NotStreamed && code == exitGap, fmt.Sprintf("exit %d, %+v", code, x)
	})
	if _, err := operator.Retire(context.Background(), operator.RetireConfig{Target: env.TargetURL, Tables: []string{"public.x"}}); err != nil {
		t.Fatalf("retire public.x: %v", err)
	}
	waitCovered(t, env)
	d.RequireRunning(t)
}
