package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// Two daemons with their own slots, publications and tables write into one target: each keeps
// its tables' loaded state and membership under its slot, so restarting either, or both, loads
// nothing again, and both streams go on converging.
func TestDaemonsOfTwoSlotsShareATarget(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `create table b (id int primary key, v text)`,
		`insert into a select g, 'a' from generate_series(1, 3000) g`, `insert into b select g, 'b' from generate_series(1, 3000) g`)
	cfgs := []Config{testConfig(t, env), testConfig(t, env)}
	for i, table := range []string{"public.a", "public.b"} {
		cfgs[i].Slot, cfgs[i].Publication, cfgs[i].Tables = env.Name+"_"+table[7:], env.Name+"_"+table[7:], []string{table}
	}
	daemons := []*pgtest.Running{startDaemon(t, cfgs[0]), startDaemon(t, cfgs[1])}
	change := func(step string) {
		t.Helper()
		pgtest.Exec(t, env.Source, `update a set v = '`+step+`' where id % 7 = 0`, `update b set v = '`+step+`' where id % 5 = 0`,
			`insert into a select max(id) + 1, '`+step+`' from a`, `delete from b where id = (select min(id) from b)`)
	}
	converge := func(step string) {
		t.Helper()
		change(step)
		pgtest.WaitConverged(t, env, "a", "id")
		pgtest.WaitConverged(t, env, "b", "id")
	}
	converge("first")
	runs := func() string {
		return pgtest.Scalar[string](t, env.Target, `select string_agg(coalesce(slot, '-') || ':' || trigger, ',' order by id) from pgconverge.backfill_runs`)
	}
	// The rows can all be in before a load completes (its key build, its ledger rows).
	pgtest.Eventually(t, 30*time.Second, "both initial loads completed", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_runs where status <> 'completed'`)
		return n == 0, fmt.Sprintf("%d runs not completed", n)
	})
	loaded := runs()
	for _, restart := range [][]int{{0}, {1}, {1, 0}} {
		for _, i := range restart {
			daemons[i].Stop(t)
		}
		change("stopped") // the stopped daemon's slot keeps these; the other streams them
		for _, i := range restart {
			daemons[i] = startDaemon(t, cfgs[i])
		}
		converge("restarted")
	}
	if got := runs(); got != loaded {
		t.Errorf("backfill runs after the restarts: %s, want only the initial loads %s", got, loaded)
	}
	got := pgtest.Rows(t, env.Target, `select table_name || ' ' || slot from pgconverge.tables order by 1`)
	want := []string{"a " + cfgs[0].Slot, "b " + cfgs[1].Slot}
	if d := pgtest.Diff(want, got); d != "" {
		t.Errorf("tables' slots: %s", d)
	}
	for _, c := range cfgs {
		rep, err := CoverageReport(t.Context(), CoverageConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: c.Slot})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Covered {
			t.Errorf("coverage of slot %s: %+v", c.Slot, rep.Tables)
		}
	}
}

// A table is followed by one daemon: a daemon of another slot whose selection shares a table with
// a running one writes nothing for its stream (no slot, no span, no load) and retries, counting
// "overlap", until that daemon stops; then it follows both its tables. The first daemon, started
// again with the shared table, now waits in turn; without the table it goes on where it stood,
// loading nothing again.
func TestTableFollowedByAnotherRunningDaemonIsWaitedFor(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `create table b (id int primary key, v text)`,
		`create table c (id int primary key, v text)`, `insert into a select g, 'a' from generate_series(1, 2000) g`,
		`insert into b select g, 'b' from generate_series(1, 2000) g`, `insert into c select g, 'c' from generate_series(1, 2000) g`)
	first, second := testConfig(t, env), testConfig(t, env)
	first.Slot, first.Publication, first.Tables = env.Name+"_1", env.Name+"_1", []string{"public.a", "public.b"}
	second.Slot, second.Publication, second.Tables = env.Name+"_2", env.Name+"_2", []string{"public.b", "public.c"}
	firstMon, secondMon := &retryCounter{}, &retryCounter{}
	first.Monitor, second.Monitor = firstMon, secondMon
	d1 := startDaemon(t, first)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitConverged(t, env, "b", "id")
	d2 := startDaemon(t, second)
	pgtest.Eventually(t, 60*time.Second, "the second daemon retried twice over the shared table", func() (bool, string) {
		n := secondMon.counts()
		return n["overlap"] >= 2, fmt.Sprint(n)
	})
	if got := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where slot_name = $1`, second.Slot); got != 0 {
		t.Errorf("source slots named %s: %d, want none while the first daemon follows public.b", second.Slot, got)
	}
	wrote := pgtest.Scalar[string](t, env.Target, `select (select count(*) from pgconverge.stream_segments where slot = $1) || ' segments, ' ||
  (select count(*) from pgconverge.backfill_runs where slot = $1) || ' runs, table c ' || coalesce(to_regclass('public.c')::text, 'missing')`, second.Slot)
	if want := "0 segments, 0 runs, table c missing"; wrote != want {
		t.Errorf("what the waiting daemon wrote on the target: %s, want %s", wrote, want)
	}
	pgtest.Exec(t, env.Source, `update b set v = 'while both run' where id % 3 = 0`)
	pgtest.WaitConverged(t, env, "b", "id")
	d2.RequireRunning(t)

	d1.Stop(t)
	pgtest.Exec(t, env.Source, `update b set v = 'second follows' where id % 5 = 0`, `update c set v = 'second follows' where id % 7 = 0`)
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.WaitConverged(t, env, "c", "id")

	runs := func() string {
		return pgtest.Scalar[string](t, env.Target, `select string_agg(slot || ':' || trigger, ',' order by id) from pgconverge.backfill_runs where slot = $1`, first.Slot)
	}
	loaded := runs()
	d1 = startDaemon(t, first)
	pgtest.Eventually(t, 60*time.Second, "the first daemon, started again with public.b, retried over it", func() (bool, string) {
		n := firstMon.counts()
		return n["overlap"] >= 1, fmt.Sprint(n)
	})
	d1.Stop(t)
	first.Tables = []string{"public.a"}
	d1 = startDaemon(t, first)
	pgtest.Exec(t, env.Source, `update a set v = 'first again' where id % 4 = 0`, `update b set v = 'still second' where id % 6 = 0`)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitConverged(t, env, "b", "id")
	if got := runs(); got != loaded {
		t.Errorf("backfill runs of the first slot after it gave up public.b: %s, want %s (nothing loaded again)", got, loaded)
	}
	d1.RequireRunning(t)
	d2.RequireRunning(t)
}

// Two daemons whose selections share a table and that start at once on a new target cannot both
// take it: they record their spans in turn (coverage.LockFollowing), so one follows the table and
// the other waits.
func TestDaemonsStartedAtOnceDoNotBothTakeATable(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table s (id int primary key, v text)`, `insert into s select g, 's' from generate_series(1, 500) g`)
	cfgs := []Config{testConfig(t, env), testConfig(t, env)}
	mons := []*retryCounter{{}, {}}
	for i := range cfgs {
		cfgs[i].Slot, cfgs[i].Publication, cfgs[i].Tables = fmt.Sprintf("%s_%d", env.Name, i), fmt.Sprintf("%s_%d", env.Name, i), []string{"public.s"}
		cfgs[i].Monitor = mons[i]
	}
	start := make(chan struct{})
	for i := range cfgs {
		pgtest.Start(t, func(ctx context.Context) error { <-start; return Run(ctx, cfgs[i]) })
	}
	close(start)
	pgtest.Eventually(t, 60*time.Second, "one daemon follows public.s and the other waits", func() (bool, string) {
		if !pgtest.Scalar[bool](t, env.Target, `select to_regclass('pgconverge.table_spans') is not null`) {
			return false, "no ledger yet"
		}
		open := pgtest.Scalar[string](t, env.Target, `select coalesce(string_agg(s.slot, ',' order by s.slot), '')
from pgconverge.table_spans t join pgconverge.stream_segments s on s.id = t.segment_id
where t.table_name = 's' and t.end_lsn is null and s.end_lsn is null`)
		waits := mons[0].counts()["overlap"] + mons[1].counts()["overlap"]
		return open != "" && !strings.Contains(open, ",") && waits >= 1, fmt.Sprintf("open spans of %q; overlap retries %d", open, waits)
	})
	pgtest.Exec(t, env.Source, `update s set v = 'after' where id % 2 = 0`)
	pgtest.WaitConverged(t, env, "s", "id")
}
