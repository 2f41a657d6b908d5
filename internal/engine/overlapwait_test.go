package engine_test

import (
	"fmt"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/operator"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// waitsOf returns the waits the coverage report and the status report of env's target show, each
// as "slot table followed_by", joined by "; ".
func waitsOf(t *testing.T, env *pgtest.Env, slot string) (inCoverage, inStatus string) {
	t.Helper()
	text := func(ws []coverage.Wait) string {
		out := ""
		for i, w := range ws {
			if i > 0 {
				out += "; "
			}
			out += fmt.Sprintf("%s %s %s", w.Slot, w.Table, w.FollowedBy)
		}
		return out
	}
	rep, err := operator.CoverageReport(t.Context(), operator.CoverageConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: slot})
	if err != nil {
		t.Fatal(err)
	}
	st, err := operator.Status(t.Context(), operator.StatusConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: slot})
	if err != nil {
		t.Fatal(err)
	}
	return text(rep.Waiting), text(st.Waiting)
}

// A daemon whose selection shares a table with the running daemon of another slot leaves that
// table to it and streams its other table meanwhile (its slot, spans and loads are its own table's
// only), and status and coverage say which slot waits for which table and which slot follows it.
// Once the first daemon stops, the waiting one takes the shared table over at the seam: the
// target equals the source, and the table is covered, without a gap, by the second slot.
func TestWaitingDaemonStreamsItsOtherTables(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `create table b (id int primary key, v text)`,
		`create table c (id int primary key, v text)`, `insert into a select g, 'a' from generate_series(1, 1000) g`,
		`insert into b select g, 'b' from generate_series(1, 1000) g`, `insert into c select g, 'c' from generate_series(1, 1000) g`)
	first, second := testConfig(t, env), testConfig(t, env)
	quickOverlap(&first, &second)
	first.Slot, first.Publication, first.Tables = env.Name+"_1", env.Name+"_1", []string{"public.a", "public.b"}
	second.Slot, second.Publication, second.Tables = env.Name+"_2", env.Name+"_2", []string{"public.b", "public.c"}
	secondMon := &retryCounter{}
	second.Monitor = secondMon
	d1 := startDaemon(t, first)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitConverged(t, env, "b", "id")
	d2 := startDaemon(t, second)
	pgtest.WaitConverged(t, env, "c", "id")
	pgtest.Exec(t, env.Source, `update c set v = 'streamed while waiting' where id % 3 = 0`, `update b set v = 'first follows' where id % 4 = 0`)
	pgtest.WaitConverged(t, env, "c", "id")
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.Eventually(t, 30*time.Second, "the second daemon counts its wait", func() (bool, string) {
		return secondMon.counts()["overlap"] >= 1, fmt.Sprint(secondMon.counts())
	})
	following := func(table string) string {
		return pgtest.Scalar[string](t, env.Target, `select coalesce(string_agg(s.slot, ',' order by s.slot), '')
from pgconverge.table_spans t join pgconverge.stream_segments s on s.id = t.segment_id
where t.table_name = $1 and t.end_lsn is null and s.end_lsn is null`, table)
	}
	if got := following("b"); got != first.Slot {
		t.Errorf("slots following public.b while both run: %q, want only %s", got, first.Slot)
	}
	if got := following("c"); got != second.Slot {
		t.Errorf("slots following public.c while both run: %q, want %s", got, second.Slot)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfills b join pgconverge.backfill_runs r on r.id = b.run_id
where r.slot = $1 and b.table_name = 'b'`, second.Slot); n != 0 {
		t.Errorf("backfills of public.b by the waiting slot: %d, want none", n)
	}
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_publication_tables where pubname = $1 and tablename = 'b'`, second.Publication); n != 0 {
		t.Errorf("public.b is in the waiting daemon's publication")
	}
	want := second.Slot + " public.b " + first.Slot
	if cov, st := waitsOf(t, env, second.Slot); cov != want || st != want {
		t.Errorf("waits in coverage: %q, in status: %q, want %q in both", cov, st, want)
	}
	d2.RequireRunning(t)

	d1.Stop(t)
	pgtest.Exec(t, env.Source, `update b set v = 'handed over' where id % 5 = 0`, `insert into b select g, 'new' from generate_series(1001, 1100) g`)
	pgtest.Eventually(t, 90*time.Second, "the second daemon follows public.b", func() (bool, string) {
		got := following("b")
		return got == second.Slot, got
	})
	pgtest.Exec(t, env.Source, `update b set v = 'second follows' where id % 7 = 0`, `delete from b where id % 11 = 0`, `update c set v = 'still' where id % 9 = 0`)
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.WaitConverged(t, env, "c", "id")
	rep, err := operator.CoverageReport(t.Context(), operator.CoverageConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: second.Slot})
	if err != nil {
		t.Fatal(err)
	}
	if tr := tableReport(t, rep, "public.b"); tr.Status != coverage.Covered || tr.Slot != second.Slot || tr.GapBytes != 0 {
		t.Errorf("public.b after the handover: %+v, want covered by %s without a gap", tr, second.Slot)
	}
	if cov, st := waitsOf(t, env, second.Slot); cov != "" || st != "" {
		t.Errorf("waits after the handover: coverage %q, status %q, want none", cov, st)
	}
	d2.RequireRunning(t)
}

// A table kept by snapshots only is kept by one daemon too: a second daemon that selects it leaves
// it to the first (no load, no scheduled refresh of it under its slot) while following its other
// table, and coverage names the wait; once the first stops, the second keeps it.
func TestSnapshotOnlyTableKeptByOneDaemon(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create unlogged table u (id int primary key, v text)`, `insert into u select g, 'u' from generate_series(1, 300) g`,
		`create table a (id int primary key, v text)`, `insert into a select g, 'a' from generate_series(1, 100) g`,
		`create table c (id int primary key, v text)`, `insert into c select g, 'c' from generate_series(1, 100) g`)
	first, second := testConfig(t, env), testConfig(t, env)
	quickOverlap(&first, &second)
	first.Slot, first.Publication, first.Tables = env.Name+"_1", env.Name+"_1", []string{"public.a", "public.u"}
	second.Slot, second.Publication, second.Tables = env.Name+"_2", env.Name+"_2", []string{"public.u", "public.c"}
	for _, c := range []*Config{&first, &second} {
		refreshEverySecond(t, c)
	}
	refreshes := func(slot string) int64 {
		return pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfills b join pgconverge.backfill_runs r on r.id = b.run_id
where coalesce(r.slot, r.leader_slot) = $1 and b.table_name = 'u'`, slot)
	}
	d1 := startDaemon(t, first)
	pgtest.WaitConverged(t, env, "u", "id")
	pgtest.WaitConverged(t, env, "a", "id")
	d2 := startDaemon(t, second)
	pgtest.WaitConverged(t, env, "c", "id")
	before := refreshes(first.Slot)
	pgtest.Exec(t, env.Source, `update u set v = 'refreshed' where id % 2 = 0`, `update c set v = 'streamed' where id % 3 = 0`)
	pgtest.WaitConverged(t, env, "u", "id")
	pgtest.WaitConverged(t, env, "c", "id")
	pgtest.Eventually(t, 60*time.Second, "the first daemon refreshes public.u again", func() (bool, string) {
		n := refreshes(first.Slot)
		return n >= before+3, fmt.Sprint(n)
	})
	if n := refreshes(second.Slot); n != 0 {
		t.Errorf("backfills of public.u by the second slot while the first keeps it: %d, want none", n)
	}
	want := second.Slot + " public.u " + first.Slot
	if cov, st := waitsOf(t, env, second.Slot); cov != want || st != want {
		t.Errorf("waits in coverage: %q, in status: %q, want %q in both", cov, st, want)
	}
	rep, err := operator.CoverageReport(t.Context(), operator.CoverageConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: first.Slot})
	if err != nil {
		t.Fatal(err)
	}
	if tr := tableReport(t, rep, "public.u"); tr.Status != coverage.SnapshotOnly || tr.KeptBy != first.Slot {
		t.Errorf("public.u while both run: %+v, want snapshot-only, kept by %s", tr, first.Slot)
	}

	d1.Stop(t)
	pgtest.Eventually(t, 90*time.Second, "the second daemon keeps public.u", func() (bool, string) {
		kept := pgtest.Scalar[string](t, env.Target, `select coalesce(kept_by, '') from pgconverge.tables where table_name = 'u'`)
		return kept == second.Slot && refreshes(second.Slot) >= 2, fmt.Sprintf("kept by %q, %d refreshes", kept, refreshes(second.Slot))
	})
	pgtest.Exec(t, env.Source, `update u set v = 'second keeps' where id % 5 = 0`)
	pgtest.WaitConverged(t, env, "u", "id")
	d2.RequireRunning(t)
}

// A daemon without --tables follows its publication: one whose publication holds a table the
// running daemon of another slot follows skips that table's changes while it streams the others,
// without restarting at its catalog checks, and takes the table over at the seam once the other
// daemon stops (its stream skipped the table's changes until then: the table is loaded again).
func TestWaitingDaemonWithoutTablesSkipsTheSharedTable(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table b (id int primary key, v text)`, `create table c (id int primary key, v text)`,
		`insert into b select g, 'b' from generate_series(1, 500) g`, `insert into c select g, 'c' from generate_series(1, 500) g`)
	first, second := testConfig(t, env), testConfig(t, env)
	quickOverlap(&first, &second)
	first.Slot, first.Publication, first.Tables = env.Name+"_1", env.Name+"_1", []string{"public.b"}
	second.Slot, second.Publication, second.Tables = env.Name+"_2", env.Name+"_2", nil
	pgtest.Exec(t, env.Source, `create publication `+second.Publication+` for table b, c`)
	secondMon := &retryCounter{}
	second.Monitor = secondMon
	d1 := startDaemon(t, first)
	pgtest.WaitConverged(t, env, "b", "id")
	d2 := startDaemon(t, second)
	pgtest.WaitConverged(t, env, "c", "id")
	for i := range 3 {
		pgtest.Exec(t, env.Source, fmt.Sprintf(`update b set v = 'both run %d' where id %% 3 = 0`, i), fmt.Sprintf(`update c set v = 'both run %d' where id %% 4 = 0`, i))
		pgtest.WaitConverged(t, env, "b", "id")
		pgtest.WaitConverged(t, env, "c", "id")
	}
	// The catalog checks (every 5 s) vouch for c's membership once two of them passed, each of
	// which would have restarted the session over the skipped table (counted "restart").
	pgtest.Eventually(t, 60*time.Second, "two catalog checks of the second daemon passed", func() (bool, string) {
		pgtest.Exec(t, env.Source, `update c set v = v || '.' where id = 1`)
		confirmed := pgtest.Scalar[bool](t, env.Target, `select coalesce(bool_or(t.confirmed_lsn > t.start_lsn), false)
from pgconverge.table_spans t join pgconverge.stream_segments s on s.id = t.segment_id
where s.slot = $1 and t.table_name = 'c' and t.end_lsn is null and s.end_lsn is null`, second.Slot)
		n := secondMon.counts()
		return confirmed && n["overlap"] >= 1, fmt.Sprintf("c confirmed past its start: %t, retries %v", confirmed, n)
	})
	if n := secondMon.counts(); n["restart"] != 0 {
		t.Errorf("the second daemon's retries while it skips public.b: %v, want no restart", n)
	}
	open := func() string {
		return pgtest.Scalar[string](t, env.Target, `select coalesce(string_agg(s.slot, ',' order by s.slot), '')
from pgconverge.table_spans t join pgconverge.stream_segments s on s.id = t.segment_id
where t.table_name = 'b' and t.end_lsn is null and s.end_lsn is null`)
	}
	if got := open(); got != first.Slot {
		t.Errorf("slots following public.b while both run: %q, want only %s", got, first.Slot)
	}
	d1.Stop(t)
	pgtest.Exec(t, env.Source, `update b set v = 'between' where id % 5 = 0`, `delete from b where id % 13 = 0`)
	pgtest.Eventually(t, 90*time.Second, "the second daemon follows public.b", func() (bool, string) {
		got := open()
		return got == second.Slot, got
	})
	pgtest.Exec(t, env.Source, `update b set v = 'after' where id % 7 = 0`, `insert into b values (9001, 'new')`)
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.WaitConverged(t, env, "c", "id")
	rep, err := operator.CoverageReport(t.Context(), operator.CoverageConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: second.Slot})
	if err != nil {
		t.Fatal(err)
	}
	if tr := tableReport(t, rep, "public.b"); tr.Status != coverage.Covered || tr.Slot != second.Slot || tr.GapBytes != 0 {
		t.Errorf("public.b after the handover: %+v, want covered by %s without a gap", tr, second.Slot)
	}
	d2.RequireRunning(t)
}
