package engine_test

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// The default selection (no --tables) takes every table of the database that pgconverge can
// carry: those no publication can carry (UNLOGGED, REPLICA IDENTITY NOTHING, no key and not FULL,
// a DEFERRABLE primary key without FULL) are kept by snapshots, each with its reason in the log and
// in coverage, also once the publication exists; a DEFERRABLE key with REPLICA IDENTITY FULL is
// streamed by whole rows, an in-statement key shift included. They were skipped with a warning.
func TestDefaultSelectionKeepsEveryTable(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table ok (id int primary key, v text)`,
		`create unlogged table scratch (id int primary key, v text)`,
		`create table nothing (id int primary key, v text)`, `alter table nothing replica identity nothing`,
		`create table heap (x int, y text)`,
		`create table d_plain (id int primary key deferrable, v text)`,
		`create table d_full (id int primary key deferrable initially deferred, v text)`, `alter table d_full replica identity full`)
	for _, tab := range []string{"ok", "scratch", "nothing", "d_plain", "d_full"} {
		pgtest.Exec(t, env.Source, `insert into `+tab+` select g, 'v' || g from generate_series(1, 20) g`)
	}
	pgtest.Exec(t, env.Source, `insert into heap select g % 5, 'h' from generate_series(1, 30) g`)
	reasons := map[string]string{"public.scratch": "UNLOGGED", "public.nothing": "REPLICA IDENTITY NOTHING",
		"public.heap": "REPLICA IDENTITY is not FULL", "public.d_plain": "DEFERRABLE"}
	run := func() (*pgtest.Running, *pgtest.SyncBuffer) {
		logs := &pgtest.SyncBuffer{}
		cfg := testConfig(t, env)
		refreshEverySecond(t, &cfg)
		cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(pgtest.LogWriter(t), logs), nil))
		d := startDaemon(t, cfg)
		pgtest.WaitStreaming(t, env)
		for _, tab := range []string{"ok", "scratch", "nothing", "d_plain", "d_full"} {
			pgtest.WaitConverged(t, env, tab, "id")
		}
		waitSameMultiset(t, env, "heap")
		rep := waitCovered(t, env)
		for table, reason := range reasons {
			tr := tableReport(t, rep, table)
			if tr.Status != coverage.SnapshotOnly || !strings.Contains(tr.Note, reason) {
				t.Errorf("%s: %+v, want snapshot-only saying why (%s)", table, tr, reason)
			}
			if !strings.Contains(logs.String(), table) || !strings.Contains(logs.String(), reason) {
				t.Errorf("the log does not name %s with its reason (%s)", table, reason)
			}
		}
		for _, table := range []string{"public.ok", "public.d_full"} {
			if tr := tableReport(t, rep, table); tr.Status != coverage.Covered || tr.Slot != env.Name {
				t.Errorf("%s: %+v, want covered by the stream", table, tr)
			}
		}
		if strings.Contains(logs.String(), "skipping table") {
			t.Errorf("the default selection skipped a table: %s", logs.String())
		}
		return d, logs
	}
	d, _ := run()
	published := pgtest.Rows(t, env.Source, `select tablename::text from pg_publication_tables where pubname = '`+env.Name+`' order by 1`)
	if diff := pgtest.Diff([]string{"d_full", "ok"}, published); diff != "" {
		t.Errorf("published tables: %s", diff)
	}
	// A statement that shifts every key through duplicates of a DEFERRABLE key loses nothing.
	pgtest.Exec(t, env.Source, `update d_full set id = id + 1`, `update d_full set v = 'w' where id = 2`, `delete from d_full where id = 21`)
	pgtest.WaitConverged(t, env, "d_full", "id")
	d.Stop(t)
	// The publication exists now; the next run's default selection still keeps them all.
	pgtest.Exec(t, env.Source, `insert into scratch values (100, 'later')`, `delete from heap where x = 1`)
	d, _ = run()
	// A table kept by snapshots that becomes streamable joins the stream.
	pgtest.Exec(t, env.Source, `alter table heap replica identity full`)
	delete(reasons, "public.heap")
	pgtest.Eventually(t, 60*time.Second, "heap published", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_publication_tables where pubname = $1 and tablename = 'heap'`, env.Name)
		return n == 1, ""
	})
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `insert into heap values (9, 'streamed')`)
	waitSameMultiset(t, env, "heap")
	if tr := tableReport(t, waitCovered(t, env), "public.heap"); tr.Status != coverage.Covered {
		t.Errorf("heap after joining the stream: %+v, want covered", tr)
	}
	d.RequireRunning(t)
}

// A source whose tables can all only be kept by snapshots is no reason to stop: the daemon runs,
// loads them and refreshes them (it exited with "no table to replicate").
func TestOnlyTablesKeptBySnapshots(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table heap (x int, y text)`, `insert into heap select g % 5, 'h' from generate_series(1, 30) g`)
	cfg := testConfig(t, env)
	refreshEverySecond(t, &cfg)
	d := startDaemon(t, cfg)
	waitSameMultiset(t, env, "heap")
	pgtest.Exec(t, env.Source, `insert into heap values (7, 'refreshed')`)
	waitSameMultiset(t, env, "heap")
	if tr := tableReport(t, waitCovered(t, env), "public.heap"); tr.Status != coverage.SnapshotOnly {
		t.Errorf("heap: %+v, want snapshot-only", tr)
	}
	d.RequireRunning(t)
}

// A --tables pattern that matches a table kept by snapshots (a DEFERRABLE key, REPLICA IDENTITY
// NOTHING) keeps it without restarting the session at every catalog check (it restarted every
// 5 s: the check took it for a new table).
func TestPatternKeepsTablesBySnapshotsWithoutRestarts(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `insert into a values (1)`,
		`create table dp (id int primary key deferrable)`, `insert into dp values (1)`,
		`create table rin (id int primary key)`, `alter table rin replica identity nothing`, `insert into rin values (1)`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.*"}
	mon := &retryCounter{}
	cfg.Monitor = mon
	d := startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.WaitConverged(t, env, "dp", "id")
	pgtest.WaitConverged(t, env, "rin", "id")
	after := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	waitSpansConfirmed(t, env, after, 1) // a catalog check passed
	after = lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	waitSpansConfirmed(t, env, after, 1) // and another
	if c := mon.counts(); len(c) != 0 {
		t.Errorf("sessions retried %v, want none", c)
	}
	d.RequireRunning(t)
}

// A table kept by snapshots that is dropped (or renamed) on the source ends the session, so the
// next one selects the tables again: the others' refreshes go on (every refresh run failed on the
// missing table, and with it the others').
func TestDroppedTableKeptBySnapshotsStopsNoRefresh(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table ok (id int primary key)`, `create unlogged table h2 (x int)`, `insert into h2 values (2)`)
	cfg := testConfig(t, env)
	refreshEverySecond(t, &cfg)
	d := startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `create table h1 (x int primary key)`, `alter table h1 replica identity nothing`,
		`create table h3 (x int)`, `create unlogged table h5 (x int primary key)`,
		`insert into h1 values (1)`, `insert into h3 values (3)`, `insert into h5 values (5)`)
	pgtest.WaitConverged(t, env, "h1", "x")
	pgtest.WaitConverged(t, env, "h5", "x")
	waitSameMultiset(t, env, "h3")
	pgtest.Exec(t, env.Source, `drop table h1`, `drop table h5`, `insert into h2 values (20)`, `insert into h3 values (30)`)
	waitSameMultiset(t, env, "h2")
	waitSameMultiset(t, env, "h3")
	pgtest.Exec(t, env.Source, `alter table h3 rename to h4`, `insert into h4 values (40)`)
	waitSameMultiset(t, env, "h4")
	d.RequireRunning(t)
}
