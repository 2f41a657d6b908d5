package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/internal/schedule"
	"github.com/pgconverge/pgconverge/internal/verify"
)

// verifyConfig is the verify.Run configuration of the test's databases.
func verifyConfig(t *testing.T, env *pgtest.Env, repair bool, tables ...string) verify.Config {
	return verify.Config{Source: env.SourceURL, Target: env.TargetURL, Tables: tables, Repair: repair, Wait: 60 * time.Second,
		Logger: slog.New(slog.NewTextHandler(pgtest.LogWriter(t), &slog.HandlerOptions{Level: slog.LevelInfo}))}
}

// verifyOnce runs verify.Run and fails the test on an error.
func verifyOnce(t *testing.T, cfg verify.Config) verify.Report {
	t.Helper()
	rep, err := verify.Run(t.Context(), cfg)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	return rep
}

// kindsOf returns the open discrepancies of table as key (jsonb text) → kind.
func kindsOf(t *testing.T, env *pgtest.Env, table string) map[string]string {
	t.Helper()
	rows, err := env.Target.Query(t.Context(), `select key::text, kind from pgconverge.discrepancies
where table_name = $1 and remediated_at is null`, table)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Equal tables (with tombstones and key changes) record nothing and fetch no rows; drift written
// into the target by hand is found with its kind, recorded once however often verify runs,
// repaired and closed by --repair, and not found again.
func TestVerifyFindsRecordsAndRepairsDrift(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table acct (id int primary key, name text, bal numeric)`,
		`insert into acct select g, 'n' || g, g * 1.5 from generate_series(1, 5000) g`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "acct", "id")
	pgtest.Exec(t, env.Source, `delete from acct where id between 100 and 110`, `update acct set id = id + 10000 where id between 200 and 205`,
		`update acct set name = null where id = 300`)
	pgtest.WaitConverged(t, env, "acct", "id")

	rep := verifyOnce(t, verifyConfig(t, env, false))
	tab := rep.Tables[0]
	if rep.Found != 0 || rep.Open != 0 || tab.RowsFetched != 0 || tab.RowsCompared != 5000-11 || tab.State != "compared" {
		t.Fatalf("equal tables: %+v", rep)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.discrepancies`); n != 0 {
		t.Fatalf("equal tables recorded %d discrepancies", n)
	}

	pgtest.Exec(t, env.Target,
		`update acct set bal = -1 where id = 10`,                                        // different
		`delete from acct where id = 20`,                                                // missing: absent
		`update acct set _cdc_deleted = true where id = 30`,                             // missing: tombstone
		`insert into acct (id, name, _cdc_lsn, _cdc_seq) values (99999, 'x', '0/1', 0)`, // extra
		`update acct set _cdc_deleted = false, name = 'back' where id = 105`)            // extra: tombstone made live
	want := map[string]string{`{"id": "10"}`: "different", `{"id": "20"}`: "missing", `{"id": "30"}`: "missing",
		`{"id": "99999"}`: "extra", `{"id": "105"}`: "extra"}
	var snaps []string
	for run := 1; run <= 2; run++ {
		rep = verifyOnce(t, verifyConfig(t, env, false))
		snaps = append(snaps, rep.Snapshot)
		if rep.Found != 5 || rep.Open != 5 {
			t.Fatalf("run %d: found %d, open %d, want 5 and 5: %+v", run, rep.Found, rep.Open, rep.Tables)
		}
		if got := kindsOf(t, env, "public.acct"); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("run %d: open discrepancies %v, want %v", run, got, want)
		}
		if run == 2 && rep.Tables[0].New != 0 {
			t.Errorf("a second run over the same drift recorded %d new discrepancies", rep.Tables[0].New)
		}
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.discrepancies where seen = 2`); n != 5 {
		t.Errorf("%d discrepancies seen twice, want 5", n)
	}
	// The second run's replay is in the audit, once, in the transaction that recorded it: the
	// window from the first run's snapshot to its own.
	got := pgtest.Rows(t, env.Target, `select path || ' ' || (verify_run = `+fmt.Sprint(rep.RunID)+`)::text || ' ' || table_name || ' ' || first_lsn::text || ' ' || last_lsn::text
  || ' ' || rows_offered::text || ' ' || rows_suppressed::text from pgconverge.suppressed_replays`)
	if d := pgtest.Diff([]string{"verify true public.acct " + snaps[0] + " " + snaps[1] + " 5 5"}, got); d != "" {
		t.Errorf("suppressed-replay audit: %s", d)
	}
	if v := pgtest.Scalar[string](t, env.Target, `select source_values->>'bal' || '/' || (target_values->>'bal') from pgconverge.discrepancies where key->>'id' = '10'`); v != "15.0/-1" {
		t.Errorf("values of the different row: %s, want 15.0/-1", v)
	}

	rep = verifyOnce(t, verifyConfig(t, env, true))
	if rep.Repaired != 5 || rep.Open != 0 || rep.RepairSnapshot == "" {
		t.Fatalf("repair: %+v", rep)
	}
	pgtest.WaitConverged(t, env, "acct", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.discrepancies where remediation = 'repaired' and repair_lsn is not null`); n != 5 {
		t.Errorf("%d discrepancies closed as repaired, want 5", n)
	}
	// The last run also deletes the audit rows past their retention, and only those.
	pgtest.Exec(t, env.Target, `insert into pgconverge.suppressed_replays (path, verify_run, table_name, first_lsn, last_lsn, rows_offered, rows_suppressed, recorded_at)
  values ('verify', 1, 'public.acct', '0/1', '0/2', 1, 1, now() - interval '31 days')`)
	audited := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.suppressed_replays where recorded_at > now() - interval '1 day'`)
	cfg := verifyConfig(t, env, false)
	cfg.AuditRetention = coverage.DefaultAuditRetention
	rep = verifyOnce(t, cfg)
	if rep.Found != 0 || rep.Open != 0 || rep.Tables[0].RowsFetched != 0 {
		t.Errorf("after the repair: %+v", rep)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.suppressed_replays where recorded_at < now() - interval '30 days'`); n != 0 {
		t.Errorf("%d audit rows past the 30-day retention left", n)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.suppressed_replays`); n != audited {
		t.Errorf("%d audit rows within the retention, want the %d there were", n, audited)
	}
}

// envVerifyKill makes the test binary a child that runs verify --repair and kills itself with
// SIGKILL before its second repair transaction commits.
const envVerifyKill = "PGCONVERGE_VERIFY_KILL"

func verifyRepairChild() int {
	n := 0
	cfg := verify.Config{Source: os.Getenv(envCrashSrc), Target: os.Getenv(envCrashTgt), Repair: true, Wait: time.Minute,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
		BeforeRepairCommit: func(string) {
			if n++; n == 2 {
				kill()
			}
		}}
	_, err := verify.Run(context.Background(), cfg)
	fmt.Fprintf(os.Stderr, "verify child reached the end without crashing: %v\n", err)
	return 3
}

// A repair killed by SIGKILL between its transactions and run again repairs every key once: the
// keys the first run closed keep its repair, nothing is left open, and the table equals the
// source.
func TestVerifyRepairKilledAndRerun(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table acct (id int primary key, name text)`,
		`insert into acct select g, 'n' || g from generate_series(1, 5000) g`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "acct", "id")
	pgtest.Exec(t, env.Target, `update acct set name = 'drift' where id <= 2500`)
	if rep, _ := verify.Run(t.Context(), verifyConfig(t, env, false)); rep.Open != 2500 {
		t.Fatalf("found %d open, want 2500", rep.Open)
	}
	child := crashChildCmd(env, "", 0)
	child.Env = append(child.Env, envVerifyKill+"=1")
	out, err := child.CombinedOutput()
	requireKilled(t, err, out)
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.discrepancies where remediation = 'repaired'`); n != verify.RepairBatchRows {
		t.Fatalf("%d discrepancies repaired before the kill, want %d", n, verify.RepairBatchRows)
	}
	first := pgtest.Scalar[string](t, env.Target, `select min(repair_lsn)::text from pgconverge.discrepancies`)
	rep := verifyOnce(t, verifyConfig(t, env, true))
	if rep.Open != 0 || rep.Repaired != 2500-verify.RepairBatchRows {
		t.Fatalf("rerun: repaired %d, open %d, want %d and 0", rep.Repaired, rep.Open, 2500-verify.RepairBatchRows)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.discrepancies where repair_lsn = $1::pg_lsn`, first); n != verify.RepairBatchRows {
		t.Errorf("%d discrepancies keep the first repair, want %d", n, verify.RepairBatchRows)
	}
	pgtest.WaitConverged(t, env, "acct", "id")
	if rep := verifyOnce(t, verifyConfig(t, env, false)); rep.Found != 0 || rep.Open != 0 {
		t.Errorf("after the rerun: %+v", rep)
	}
}

// verify while the stream applies a workload finds nothing that is not drift, however often it
// runs, and still finds a drift made meanwhile.
func TestVerifyWhileStreaming(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	setupCrashTables(t, env)
	pgtest.Exec(t, env.Source, `create table quiet (id int primary key, v text)`, `insert into quiet select g, md5(g::text) from generate_series(1, 3000) g`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "acct", "id")
	pgtest.WaitConverged(t, env, "quiet", "id")
	stop := workload(t, env)
	defer stop()
	var moved int64
	for run := 1; run <= 4; run++ {
		if run == 3 {
			pgtest.Exec(t, env.Target, `update quiet set v = 'drift' where id = 77`)
		}
		rep := verifyOnce(t, verifyConfig(t, env, false))
		want := int64(0)
		if run >= 3 {
			want = 1
		}
		for _, tab := range rep.Tables {
			moved += tab.MovedOn
			if tab.State != "compared" {
				t.Fatalf("run %d: %s %s: %s", run, tab.Table, tab.State, tab.Reason)
			}
		}
		if rep.Found != want || rep.Open != want {
			t.Fatalf("run %d under load: found %d, open %d, want %d: %+v", run, rep.Found, rep.Open, want, rep.Tables)
		}
	}
	if got := kindsOf(t, env, "public.quiet"); fmt.Sprint(got) != fmt.Sprint(map[string]string{`{"id": "77"}`: "different"}) {
		t.Errorf("open discrepancies of quiet: %v", got)
	}
	t.Logf("target rows moved past the snapshots (not compared) over 4 runs: %d", moved)
}

// Keys of every kind the fidelity tests replicate compare equal when equal, whatever their
// collation or spelling, and a drift in each is found exactly and repaired.
func TestVerifyKeysOfEveryKind(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create collation if not exists und_icu (provider = icu, locale = 'und')`,
		`create table icu (k text collate und_icu primary key, v int)`,
		`insert into icu values ('a', 1), ('B', 2), ('ä', 3), ('Ａ', 4), ('a b', 5), ('', 6), ('ß', 7), ('ss', 8)`,
		`create table num (k numeric primary key, v float8)`,
		`insert into num values (1.0, 1), (2.50, 'NaN'), ('NaN', 'Infinity'), ('Infinity', '-Infinity'), ('-Infinity', -0.0), (0.000000001, 1e-300), (-5, null)`,
		`create type color as enum ('red', 'green', 'blue')`,
		`create table comp (c color, u uuid, d date, v jsonb, p point, primary key (c, u, d))`,
		`insert into comp select (array['red','green','blue'])[1 + g % 3]::color, md5(g::text)::uuid, date '2020-01-01' + g, jsonb_build_object('g', g), point(g, -g) from generate_series(1, 300) g`)
	startDaemon(t, testConfig(t, env))
	for _, tab := range []string{"icu", "num", "comp"} {
		pgtest.WaitConvergedColumns(t, env, tab, pgtest.SourceColumns(t, env.Source, tab), "1")
	}
	rep := verifyOnce(t, verifyConfig(t, env, false))
	for _, tab := range rep.Tables {
		if tab.State != "compared" || tab.RowsFetched != 0 || len(tab.Found) != 0 && (tab.Found["missing"]+tab.Found["extra"]+tab.Found["different"]) != 0 {
			t.Fatalf("equal %s: %+v", tab.Table, tab)
		}
	}
	pgtest.Exec(t, env.Target,
		`update icu set v = 0 where k = 'ä'`,
		`update num set v = 2 where k = 'NaN'`,
		`update comp set p = point(0, 0) where u = md5('5')::uuid`)
	rep = verifyOnce(t, verifyConfig(t, env, true))
	if rep.Found != 3 || rep.Repaired != 3 || rep.Open != 0 {
		t.Fatalf("drift: %+v", rep)
	}
	for _, tab := range rep.Tables {
		if tab.Found["different"] != 1 {
			t.Errorf("%s: found %v, want one different row", tab.Table, tab.Found)
		}
	}
	for _, tab := range []string{"icu", "num", "comp"} {
		pgtest.WaitConvergedColumns(t, env, tab, pgtest.SourceColumns(t, env.Source, tab), "1")
	}
}

// run --verify-schedule verifies inside the daemon with the same code, and --verify-repair repairs
// what it finds while the daemon streams.
func TestScheduledVerifyRepairs(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table acct (id int primary key, name text)`,
		`insert into acct select g, 'n' || g from generate_series(1, 2000) g`)
	cfg := testConfig(t, env)
	var err error
	if cfg.VerifySchedule, err = schedule.Parse("@every 1s"); err != nil {
		t.Fatal(err)
	}
	cfg.VerifyRepair = true
	reports := make(chan verify.Report, 100)
	// A verify running when the test ends is interrupted by the daemon's stop: only errors before
	// that count.
	var ended atomic.Bool
	cfg.Knobs.Verified = func(rep verify.Report, err error) {
		if err != nil && !ended.Load() {
			t.Errorf("scheduled verify: %v", err)
		}
		reports <- rep
	}
	startDaemon(t, cfg)
	t.Cleanup(func() { ended.Store(true) }) // runs before the daemon's stop, registered earlier
	pgtest.WaitConverged(t, env, "acct", "id")
	pgtest.Exec(t, env.Target, `update acct set name = 'drift' where id = 7`, `delete from acct where id = 8`)
	deadline := time.After(60 * time.Second)
	for repaired := int64(0); repaired < 2; {
		select {
		case rep := <-reports:
			repaired += rep.Repaired
		case <-deadline:
			t.Fatal("no scheduled verify repaired the drift within 60 s")
		}
	}
	pgtest.WaitConverged(t, env, "acct", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.discrepancies d join pgconverge.verify_runs r on r.id = d.first_run
where r.trigger = 'schedule' and d.remediation = 'repaired'`); n != 2 {
		t.Errorf("%d discrepancies found and repaired by scheduled runs, want 2", n)
	}
}

// A verify that could not compare a table it was asked for (a name that does not exist) fails,
// and its run is recorded failed with why, so status does not show it as a completed run.
func TestVerifyOfAMissingTableIsRecordedFailed(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `insert into a values (1)`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.WaitConverged(t, env, "a", "id")
	if _, err := verify.Run(t.Context(), verifyConfig(t, env, false, "public.nosuch")); !errors.Is(err, verify.ErrNotVerified) {
		t.Fatalf("verify of public.nosuch: %v, want ErrNotVerified", err)
	}
	got := pgtest.Scalar[string](t, env.Target, `select status || ': ' || coalesce(error, '') from pgconverge.verify_runs order by id desc limit 1`)
	if !strings.HasPrefix(got, "failed: ") || !strings.Contains(got, "public.nosuch") {
		t.Errorf("the last verify run is recorded %q, want failed naming public.nosuch", got)
	}
}

// A verify builds on the last one's memo: unchanged tables are not hashed again, a streamed
// change has only its group hashed, a hand edit of the target is found, a verify without --incremental hashes every
// group, a repair drops the memo, and a schema change makes the next verify hash everything.
func TestVerifyIncremental(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table acct (id int primary key, name text, bal numeric)`,
		`insert into acct select g, 'n' || g, g * 1.5 from generate_series(1, 50000) g`, `analyze acct`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "acct", "id")
	run := func(what string, full, repair bool, found int64) verify.Table {
		t.Helper()
		cfg := verifyConfig(t, env, repair)
		cfg.Incremental = !full
		rep, err := verify.Run(t.Context(), cfg)
		if err != nil {
			t.Fatalf("%s: verify: %v", what, err)
		}
		if rep.Found != found || rep.Tables[0].State != "compared" {
			t.Fatalf("%s: found %d, want %d: %+v", what, rep.Found, found, rep.Tables[0])
		}
		return rep.Tables[0]
	}
	// until runs verify until ok accepts its table, each run finding found: a transaction of
	// another test running when a verify takes its snapshots holds their xmin back, so that the
	// next verify sees rows committed after that transaction began as changed (safe: their groups
	// are hashed); the one after sees past it.
	until := func(what string, found int64, ok func(verify.Table) bool) verify.Table {
		t.Helper()
		// Another test's transaction may stay open for a minute or more under load (crash tests,
		// long applies), and each verify must outlast it.
		deadline := time.Now().Add(3 * time.Minute)
		for {
			tab := run(what, false, false, found)
			if ok(tab) {
				return tab
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v after 3 minutes of verifies", what, tab)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if tab := run("first", false, false, 0); tab.GroupsSkipped != 0 || tab.FullReason == "" || tab.RangesChecked != 1 {
		t.Fatalf("first verify: %+v, want the whole table hashed as one group", tab)
	}
	if tab := until("unchanged", 0, func(tab verify.Table) bool { return tab.GroupsSkipped == 1 }); tab.RangesChecked != 1 || tab.FullReason != "" || tab.RowsCompared != 50000 {
		t.Fatalf("verify of unchanged tables: %+v, want its one group skipped", tab)
	}
	pgtest.Exec(t, env.Source, `update acct set name = 'streamed' where id = 77`)
	pgtest.WaitConverged(t, env, "acct", "id")
	tab := run("a first streamed change", false, false, 0)
	groups := tab.RangesChecked - 1 // and the whole-table count
	if tab.GroupsSkipped != 0 || groups < 4 {
		t.Fatalf("after a first streamed change: %+v, want the table hashed by groups", tab)
	}
	if tab := until("unchanged, by groups", 0, func(tab verify.Table) bool { return tab.GroupsSkipped == groups }); tab.RangesChecked != 1 {
		t.Errorf("unchanged, by groups: %+v, want all %d groups skipped", tab, groups)
	}
	pgtest.Exec(t, env.Source, `update acct set name = 'streamed' where id = 78`)
	pgtest.WaitConverged(t, env, "acct", "id")
	run("a streamed change", false, false, 0)
	until("a streamed change", 0, func(tab verify.Table) bool { return tab.GroupsSkipped == groups })
	pgtest.Exec(t, env.Target, `update acct set bal = -1 where id = 10`)
	run("a hand edit", false, false, 1)
	// The group that differs is hashed at every verify; the others are skipped.
	until("a hand edit", 1, func(tab verify.Table) bool { return tab.GroupsSkipped == groups-1 })
	if tab := run("full", true, false, 1); tab.GroupsSkipped != 0 || tab.FullReason != "not incremental (no --incremental)" {
		t.Errorf("full: %+v, want every group hashed", tab)
	}
	run("repair", false, true, 1)
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.verify_memos`); n != 0 {
		t.Errorf("%d memos left after a repair, want none", n)
	}
	if tab := run("after the repair", false, false, 0); tab.GroupsSkipped != 0 || tab.FullReason == "" {
		t.Errorf("after a repair: %+v, want every group hashed", tab)
	}
	pgtest.Exec(t, env.Source, `alter table acct add column note text default 'x'`, `update acct set name = 'after ddl' where id = 5`)
	pgtest.WaitConvergedColumns(t, env, "acct", "id, name, bal, note", "id")
	if tab := run("after a schema change", false, false, 0); tab.GroupsSkipped != 0 || tab.FullReason == "" {
		t.Errorf("after a schema change: %+v, want every group hashed", tab)
	}
}
