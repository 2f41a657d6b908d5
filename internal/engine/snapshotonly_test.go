package engine_test

import (
	"strings"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/schedule"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// Tables no publication can carry (an UNLOGGED one, one without a key whose replica identity is
// not FULL) are kept by snapshots only: never published (the source application's UPDATEs and
// DELETEs of the keyless one go on working), loaded, refreshed at each --snapshot-schedule tick,
// reported snapshot-only with the snapshot and its age, and not counted as gaps. Once they can be
// streamed (SET LOGGED, REPLICA IDENTITY FULL) they join the stream at the seam and are covered.
func TestSnapshotOnlyTables(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create unlogged table staging (id int primary key, v text)`,
		`insert into staging select g, 'v' || g from generate_series(1, 500) g`,
		`create table heap (x int, y text)`, `insert into heap select g % 7, 'h' from generate_series(1, 300) g`,
		`create table ok (id int primary key)`, `insert into ok values (1)`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.staging,public.heap,public.ok"}
	refreshEverySecond(t, &cfg)
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "staging", "id")
	waitSameMultiset(t, env, "heap")
	pgtest.WaitStreaming(t, env)
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_publication_tables where pubname = $1 and tablename in ('staging', 'heap')`, env.Name); n != 0 {
		t.Fatalf("%d snapshot-only tables published", n)
	}
	rep := waitCovered(t, env)
	for table, reason := range map[string]string{"public.staging": "UNLOGGED", "public.heap": "REPLICA IDENTITY is not FULL"} {
		tr := tableReport(t, rep, table)
		if tr.Status != coverage.SnapshotOnly || tr.BackfillLSN == nil || !strings.Contains(tr.Note, reason) || !strings.Contains(tr.Note, tr.BackfillLSN.String()) {
			t.Errorf("%s: %+v, want snapshot-only as of its backfill, saying why (%s)", table, tr, reason)
		}
	}
	// The source changes them; the next refreshes bring the changes, rows deleted included.
	pgtest.Exec(t, env.Source, `update staging set v = 'changed' where id <= 10`, `delete from staging where id > 490`,
		`update heap set y = 'g' where x = 3`, `delete from heap where x = 4`, `insert into heap values (4, 'back'), (4, 'back')`)
	pgtest.WaitConverged(t, env, "staging", "id")
	waitSameMultiset(t, env, "heap")
	// A column added: the table is described again and refreshed with it. A TRUNCATE (an ETL's
	// staging table) needs no new session: the next refresh finds it empty.
	pgtest.Exec(t, env.Source, `alter table staging add column w int default 5`)
	pgtest.WaitConverged(t, env, "staging", "id")
	restarts := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_runs`)
	pgtest.Exec(t, env.Source, `truncate heap`, `insert into heap values (1, 'after truncate')`)
	waitSameMultiset(t, env, "heap")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_runs where trigger = 'initial' and id > $1`, restarts); n != 0 {
		t.Errorf("%d new sessions loaded tables after a TRUNCATE of a snapshot-only table, want 0", n)
	}

	// Streamable now: each joins the stream, loaded at the seam, and its changes then stream.
	pgtest.Exec(t, env.Source, `alter table staging set logged`, `alter table heap replica identity full`)
	pgtest.Eventually(t, 60*time.Second, "staging and heap published", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_publication_tables where pubname = $1 and tablename in ('staging', 'heap')`, env.Name)
		return n == 2, ""
	})
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `update staging set v = 'streamed' where id = 1`, `delete from heap where ctid = (select ctid from heap where x = 4 limit 1)`)
	pgtest.WaitConverged(t, env, "staging", "id")
	waitSameMultiset(t, env, "heap")
	rep = waitCovered(t, env)
	for _, table := range []string{"public.staging", "public.heap"} {
		if tr := tableReport(t, rep, table); tr.Status != coverage.Covered || tr.Slot != env.Name {
			t.Errorf("%s after joining the stream: %+v, want covered by slot %s", table, tr, env.Name)
		}
	}
	d.Stop(t)
}

// A table without a key or REPLICA IDENTITY FULL in a schema publication is kept by snapshots,
// without restarting the session at every catalog check (it is published, yet not streamed); given
// REPLICA IDENTITY FULL it is streamed.
func TestPublishedTableWithoutIdentityIsKeptBySnapshots(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 15, "row filters, column lists and schema publications")
	pub := `"` + env.Name + `"`
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `insert into a values (1)`,
		`create table log (at int, what text)`, `insert into log values (1, 'x'), (1, 'x')`,
		`create publication `+pub+` for tables in schema public`)
	d, mon := startCounted(t, env)
	waitSameMultiset(t, env, "log")
	pgtest.WaitStreaming(t, env)
	runs := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_runs`)
	pgtest.Exec(t, env.Source, `insert into a values (2)`)
	after := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	waitSpansConfirmed(t, env, after, 1)
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_runs`); n != runs {
		t.Errorf("%d backfill runs, want the %d of the start", n, runs)
	}
	if c := mon.counts(); len(c) != 0 {
		t.Errorf("sessions retried %v, want none", c)
	}
	pgtest.Exec(t, env.Source, `alter table log replica identity full`, `delete from log where ctid = (select min(ctid) from log)`,
		`insert into log values (2, 'y')`)
	waitSameMultiset(t, env, "log")
	pgtest.Eventually(t, 60*time.Second, "log streamed", func() (bool, string) {
		rep, _ := coverageOf(t, env)
		st := tableReport(t, rep, "public.log").Status
		return st == coverage.Covered, string(st)
	})
	d.RequireRunning(t)
}

// refreshEverySecond sets cfg's --snapshot-schedule to every second.
func refreshEverySecond(t *testing.T, cfg *Config) {
	t.Helper()
	var err error
	if cfg.SnapshotSchedule, err = schedule.Parse("@every 1s"); err != nil {
		t.Fatal(err)
	}
}
