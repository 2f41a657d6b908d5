package engine_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// A table is followed by one daemon: a daemon of another slot whose selection shares a table with
// a running one leaves that table alone (not published, no span, no load), follows its other
// table and waits, counting "overlap", until that daemon stops; then it follows both its tables,
// and the stopped slot's coverage of the shared table ends. The first daemon, started again with
// the shared table, now waits in turn; without the table it goes on where it stood, loading
// nothing again.
func TestTableFollowedByAnotherRunningDaemonIsWaitedFor(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `create table b (id int primary key, v text)`,
		`create table c (id int primary key, v text)`, `insert into a select g, 'a' from generate_series(1, 2000) g`,
		`insert into b select g, 'b' from generate_series(1, 2000) g`, `insert into c select g, 'c' from generate_series(1, 2000) g`)
	first, second := testConfig(t, env), testConfig(t, env)
	quickOverlap(&first, &second)
	first.Slot, first.Publication, first.Tables = env.Name+"_1", env.Name+"_1", []string{"public.a", "public.b"}
	second.Slot, second.Publication, second.Tables = env.Name+"_2", env.Name+"_2", []string{"public.b", "public.c"}
	firstMon, secondMon := &retryCounter{}, &retryCounter{}
	first.Monitor, second.Monitor = firstMon, secondMon
	d1 := startDaemon(t, first)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitConverged(t, env, "b", "id")
	d2 := startDaemon(t, second)
	pgtest.Eventually(t, 60*time.Second, "the second daemon waits for the first", func() (bool, string) {
		n := secondMon.counts()
		return n["overlap"] >= 1, fmt.Sprint(n)
	})
	pgtest.WaitConverged(t, env, "c", "id")
	wrote := pgtest.Scalar[string](t, env.Target, `select (select count(*) from pgconverge.table_spans t join pgconverge.stream_segments s on s.id = t.segment_id
    where s.slot = $1 and t.table_name = 'b') || ' spans of b, ' ||
  (select count(*) from pgconverge.backfills b join pgconverge.backfill_runs r on r.id = b.run_id where r.slot = $1 and b.table_name = 'b') || ' loads of b'`, second.Slot)
	if want := "0 spans of b, 0 loads of b"; wrote != want {
		t.Errorf("what the waiting daemon wrote of public.b on the target: %s, want %s", wrote, want)
	}
	pgtest.Exec(t, env.Source, `update b set v = 'while both run' where id % 3 = 0`)
	pgtest.WaitConverged(t, env, "b", "id")
	d2.RequireRunning(t)

	d1.Stop(t)
	pgtest.Exec(t, env.Source, `update b set v = 'second follows' where id % 5 = 0`, `update c set v = 'second follows' where id % 7 = 0`)
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.WaitConverged(t, env, "c", "id")
	spans := func() string {
		return pgtest.Scalar[string](t, env.Target, `select string_agg(s.slot || ' ' || coalesce(t.end_reason, 'open'), ', ' order by t.id)
from pgconverge.table_spans t join pgconverge.stream_segments s on s.id = t.segment_id where t.table_name = 'b'`)
	}
	if got, want := spans(), first.Slot+` followed by slot "`+second.Slot+`", `+second.Slot+" open"; got != want {
		t.Errorf("spans of public.b once the second daemon took it: %s, want %s", got, want)
	}

	runs := func() string {
		return pgtest.Scalar[string](t, env.Target, `select string_agg(slot || ':' || trigger, ',' order by id) from pgconverge.backfill_runs where slot = $1`, first.Slot)
	}
	loaded := runs()
	d1 = startDaemon(t, first)
	pgtest.Eventually(t, 60*time.Second, "the first daemon, started again with public.b, waits for the second", func() (bool, string) {
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
	t.Parallel()
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

// A daemon between sessions still follows its tables: while its sessions fail (a target
// constraint refuses a row) and it waits to retry, the daemon of another slot that shares a table
// keeps waiting, since the first holds its running lock for as long as its process runs.
func TestDaemonRetryingKeepsItsTables(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table b (id int primary key, v int)`, `insert into b select g, g from generate_series(1, 100) g`)
	first, second := testConfig(t, env), testConfig(t, env)
	first.Slot, first.Publication, first.Tables = env.Name+"_1", env.Name+"_1", []string{"public.b"}
	second.Slot, second.Publication, second.Tables = env.Name+"_2", env.Name+"_2", []string{"public.b"}
	firstMon, secondMon := &retryCounter{}, &retryCounter{}
	first.Monitor, second.Monitor = firstMon, secondMon
	d1 := startDaemon(t, first)
	pgtest.WaitConverged(t, env, "b", "id")
	d2 := startDaemon(t, second)
	pgtest.Eventually(t, 60*time.Second, "the second daemon waits for the first", func() (bool, string) {
		return secondMon.counts()["overlap"] >= 1, fmt.Sprint(secondMon.counts())
	})
	pgtest.Exec(t, env.Target, `alter table b add constraint v_small check (v < 1000)`)
	pgtest.Exec(t, env.Source, `update b set v = 5000 where id = 3`)
	// Backoffs of 0.5 s growing 1.5× (±50 %): seven retries spend about 15 s between sessions,
	// while the second daemon looks every 5 s.
	pgtest.Eventually(t, 120*time.Second, "the first daemon retried the refused row 7 times", func() (bool, string) {
		return firstMon.counts()["constraint"] >= 7, fmt.Sprint(firstMon.counts())
	})
	open := pgtest.Scalar[string](t, env.Target, `select string_agg(s.slot, ',' order by s.slot)
from pgconverge.table_spans t join pgconverge.stream_segments s on s.id = t.segment_id
where t.table_name = 'b' and t.end_lsn is null and s.end_lsn is null`)
	if open != first.Slot {
		t.Fatalf("slots following public.b while the first daemon retried: %s, want only %s", open, first.Slot)
	}
	pgtest.Exec(t, env.Target, `alter table b drop constraint v_small`)
	pgtest.WaitConverged(t, env, "b", "id")
	d1.RequireRunning(t)
	d2.RequireRunning(t)
	if n := secondMon.counts(); n["overlap"] < 1 || len(n) != 1 {
		t.Errorf("the second daemon's retries: %v, want only overlap", n)
	}
}

// A daemon whose target connections all broke (as in a target restart) keeps its tables. Here the
// first daemon's next session is slow to start (8 s) and its running lock is taken again only after
// 20 s, so the daemon of another slot that waits for a shared table, cut off too, comes back first
// and finds the first daemon holding neither lock; it takes nothing before that has lasted
// the grace (Knobs.OverlapGrace), and by then the first leads its slot again.
func TestDaemonsCutFromTheTargetKeepTheirTables(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table b (id int primary key, v int)`, `insert into b select g, g from generate_series(1, 100) g`)
	first, second := testConfig(t, env), testConfig(t, env)
	var sessions atomic.Int32
	first.Knobs.BeforePreflight = func() {
		if sessions.Add(1) > 1 {
			time.Sleep(8 * time.Second) // a session start slowed down (catalog reads under load), not synchronisation
		}
	}
	first.Knobs.PresenceCheckEvery = 20 * time.Second
	first.Slot, first.Publication, first.Tables = env.Name+"_1", env.Name+"_1", []string{"public.b"}
	second.Slot, second.Publication, second.Tables = env.Name+"_2", env.Name+"_2", []string{"public.b"}
	// The production timings, set here so that the watch below knows them.
	const grace, poll = 10 * time.Second, 5 * time.Second
	for _, c := range []*Config{&first, &second} {
		c.Knobs.OverlapGrace, c.Knobs.OverlapPoll = grace, poll
	}
	secondMon := &retryCounter{}
	second.Monitor = secondMon
	d1 := startDaemon(t, first)
	pgtest.WaitConverged(t, env, "b", "id")
	d2 := startDaemon(t, second)
	pgtest.Eventually(t, 60*time.Second, "the second daemon waits for the first", func() (bool, string) {
		return secondMon.counts()["overlap"] >= 1, fmt.Sprint(secondMon.counts())
	})
	following := func() string {
		return pgtest.Scalar[string](t, env.Target, `select coalesce(string_agg(s.slot, ',' order by s.slot), '')
from pgconverge.table_spans t join pgconverge.stream_segments s on s.id = t.segment_id
where t.table_name = 'b' and t.end_lsn is null and s.end_lsn is null`)
	}
	pgtest.Exec(t, env.Target, `select pg_terminate_backend(pid) from pg_stat_activity
where datname = current_database() and pid <> pg_backend_pid() and backend_type = 'client backend'`)
	// A takeover would happen within the grace and two polls of the cut: watch that long.
	for until := time.Now().Add(grace + 2*poll); time.Now().Before(until); time.Sleep(250 * time.Millisecond) {
		if got := following(); got != first.Slot {
			t.Fatalf("slots following public.b after the cut: %q, want only %s", got, first.Slot)
		}
	}
	pgtest.Exec(t, env.Source, `update b set v = v + 1 where id % 10 = 0`)
	pgtest.WaitConverged(t, env, "b", "id")
	d1.RequireRunning(t)
	d2.RequireRunning(t)
}
