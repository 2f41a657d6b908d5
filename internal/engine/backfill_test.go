package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/operator"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// testBackfillConfig returns a `pgconverge backfill` configuration for env's databases with small
// chunks, logging into the test.
func testBackfillConfig(t *testing.T, env *pgtest.Env, tables ...string) operator.BackfillConfig {
	log := testConfig(t, env).Logger
	return operator.BackfillConfig{
		Source: env.SourceURL, Target: env.TargetURL, Tables: tables, Workers: 2, ChunkRows: 1000,
		Resume: true, Logger: log, Progress: backfillrun.NewLogProgress(log, "backfill", time.Hour),
	}
}

// backfillNow runs the backfill and fails the test on an error.
func backfillNow(t *testing.T, cfg operator.BackfillConfig) backfillrun.Report {
	t.Helper()
	rep, err := operator.Backfill(context.Background(), cfg)
	if err != nil {
		t.Fatalf("backfill: %v", err)
	}
	return rep
}

// backfillAfterFirstChunk starts the backfill cfg in a goroutine and returns once its first chunk
// committed, holding it there when hold is set. finish lets it go on and returns its report; it
// fails the test when the backfill fails or takes more than 60 s.
func backfillAfterFirstChunk(t *testing.T, cfg operator.BackfillConfig, hold bool) (finish func() backfillrun.Report) {
	t.Helper()
	end := backfillAfterFirstChunkEnd(t, cfg, hold)
	return func() backfillrun.Report {
		t.Helper()
		rep, err := end()
		if err != nil {
			t.Fatalf("backfill: %v", err)
		}
		return rep
	}
}

// backfillAfterFirstChunkEnd is backfillAfterFirstChunk whose end returns the backfill's error.
func backfillAfterFirstChunkEnd(t *testing.T, cfg operator.BackfillConfig, hold bool) (end func() (backfillrun.Report, error)) {
	t.Helper()
	reached, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cfg.AfterChunk = func(string, int64) {
		once.Do(func() {
			close(reached)
			if hold {
				<-resume
			}
		})
	}
	wait, ended := backfillInBackground(t, cfg)
	select {
	case <-reached:
	case <-ended:
		_, err := wait()
		t.Fatalf("backfill ended before its first chunk: %v", err)
	}
	return func() (backfillrun.Report, error) {
		t.Helper()
		close(resume)
		return wait()
	}
}

// backfillInBackground starts the backfill cfg in a goroutine; ended closes when it returned, and
// wait returns its report and error, failing the test when it takes more than 60 s from then.
func backfillInBackground(t *testing.T, cfg operator.BackfillConfig) (wait func() (backfillrun.Report, error), ended <-chan struct{}) {
	var rep backfillrun.Report
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		rep, err = operator.Backfill(context.Background(), cfg)
	}()
	return func() (backfillrun.Report, error) {
		t.Helper()
		select {
		case <-done:
			return rep, err
		case <-time.After(60 * time.Second):
			t.Fatal("backfill did not end within 60 s")
			return backfillrun.Report{}, nil
		}
	}, done
}

// rowVersion returns the target row's value of v and its _cdc_lsn.
func rowVersion(t *testing.T, env *pgtest.Env, id int) (string, string) {
	t.Helper()
	var v, lsn string
	if err := env.Target.QueryRow(context.Background(), `select v, _cdc_lsn::text from acc where id = $1`, id).Scan(&v, &lsn); err != nil {
		t.Fatalf("target row %d: %v", id, err)
	}
	return v, lsn
}

// docs/design.md's three worked cases, made deterministic: which path delivers a change first never
// changes the outcome.
func TestBackfillWorkedCases(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table acc (id int primary key, v text)`,
		`insert into acc values (1, 'one'), (2, 'two'), (3, 'three')`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.WaitConverged(t, env, "acc", "id")

	// 1. The stream applied a change first; the backfill carries the same result at a newer version.
	pgtest.Exec(t, env.Source, `update acc set v = 'one, streamed' where id = 1`)
	pgtest.WaitConverged(t, env, "acc", "id")
	rep := backfillNow(t, testBackfillConfig(t, env, "public.acc"))
	if v, lsn := rowVersion(t, env, 1); v != "one, streamed" || lsn != rep.Snapshot.String() {
		t.Errorf("case 1: row 1 = %q at %s, want the same value at the backfill's %s", v, lsn, rep.Snapshot)
	}

	// 2. The backfill applied a change first; the lagging stream replays it and is suppressed.
	d.Stop(t)
	before := pgtest.Scalar[string](t, env.Source, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Exec(t, env.Source, `update acc set v = 'two, while the stream lagged' where id = 2`)
	after := pgtest.Scalar[string](t, env.Source, `select pg_current_wal_insert_lsn()::text`)
	rep = backfillNow(t, testBackfillConfig(t, env, "public.acc"))
	startDaemon(t, testConfig(t, env))
	pgtest.WaitSlotCaughtUp(t, env)
	if v, lsn := rowVersion(t, env, 2); v != "two, while the stream lagged" || lsn != rep.Snapshot.String() {
		t.Errorf("case 2: row 2 = %q at %s, want the update at the backfill's %s (the replayed change suppressed)", v, lsn, rep.Snapshot)
	}
	// The suppressed change is audited once, with its LSN, in the stream's transaction.
	got := pgtest.Rows(t, env.Target, `select path || ' ' || slot || ' ' || table_name || ' ' || (first_lsn = last_lsn and first_lsn > '`+before+`' and last_lsn <= '`+after+`')::text
  || ' ' || rows_offered::text || ' ' || rows_suppressed::text from pgconverge.suppressed_replays`)
	if d := pgtest.Diff([]string{"stream " + testConfig(t, env).Slot + " public.acc true 1 1"}, got); d != "" {
		t.Errorf("case 2: suppressed-replay audit (the update's LSN within %s..%s): %s", before, after, d)
	}

	// 3. A change after the snapshot: only the stream delivers it, and the backfill's older row for
	// that key, applied later, is suppressed.
	cfg := testBackfillConfig(t, env, "public.acc")
	cfg.Workers, cfg.ChunkRows = 1, 1
	finish := backfillAfterFirstChunk(t, cfg, true) // chunk (-inf, 1] is in; row 3 is read later, at the snapshot
	pgtest.Exec(t, env.Source, `update acc set v = 'three, after the snapshot' where id = 3`)
	pgtest.WaitConverged(t, env, "acc", "id")
	rep = finish()
	v, lsn := rowVersion(t, env, 3)
	if l, err := pglogrepl.ParseLSN(lsn); err != nil || v != "three, after the snapshot" || l <= rep.Snapshot {
		t.Errorf("case 3: row 3 = %q at %s, want the stream's update, newer than the snapshot %s", v, lsn, rep.Snapshot)
	}
	if rep.Result.Suppressed != 1 {
		t.Errorf("case 3: suppressed %d rows, want 1 (row 3)", rep.Result.Suppressed)
	}
	pgtest.WaitConverged(t, env, "acc", "id")
}

// Composite keys, collation-ordered text keys, an empty table, a one-row table and NULLs in
// non-key columns, each cut into several chunks read by parallel workers.
func TestBackfillKeyShapes(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table pairs (a int, b text, note text, primary key (b, a))`,
		`insert into pairs select g % 7, 'k' || (g % 13), case when g % 3 = 0 then null else 'n' || g end from generate_series(1, 91) g`,
		`create table words (w text collate "und-x-icu" primary key, n int)`,
		`insert into words select chr(65 + g % 26) || chr(97 + g % 23) || g, case when g % 2 = 0 then g end from generate_series(1, 300) g`,
		`create table empty (id int primary key, v text)`,
		`create table one (id uuid primary key, v numeric)`,
		`insert into one values ('6c0f3a2e-1f3e-4c62-9d8a-0d2f0f4b8e11', null)`)
	cfg := testBackfillConfig(t, env, "public.pairs,public.words", "public.empty", "public.one")
	cfg.ChunkRows = 7
	rep := backfillNow(t, cfg)
	if rep.Rows != 91+300+1 || rep.Result.Applied != rep.Rows {
		t.Errorf("read %d rows, applied %d, want 392 both", rep.Rows, rep.Result.Applied)
	}
	pgtest.WaitConverged(t, env, "pairs", "b, a")
	pgtest.WaitConverged(t, env, "words", "w")
	pgtest.WaitConverged(t, env, "empty", "id")
	pgtest.WaitConverged(t, env, "one", "id")
	// The empty target tables were bulk loads, cut by blocks (words fills two); a second run, into
	// the tables the target now holds, cuts them along their keys, but for the one still empty.
	ledger := `select table_name || ' ' || b.key_columns::text || ' ' || status || ' ' || (select count(*) from pgconverge.backfill_chunks c where c.backfill_id = b.id)
from pgconverge.backfills b where b.run_id = (select max(id) from pgconverge.backfill_runs) order by table_name`
	want := []string{"empty {ctid} completed 1", "one {ctid} completed 1", "pairs {ctid} completed 1", "words {ctid} completed 2"}
	if d := pgtest.Diff(want, pgtest.Rows(t, env.Target, ledger)); d != "" {
		t.Errorf("ledger of the bulk loads (table, plan, status, chunks): %s", d)
	}
	pgtest.Exec(t, env.Source, `update pairs set note = 'again' where a = 3`)
	backfillNow(t, cfg)
	pgtest.WaitConverged(t, env, "pairs", "b, a")
	pgtest.WaitConverged(t, env, "words", "w")
	want = []string{"empty {ctid} completed 1", "one {id} completed 1", "pairs {b,a} completed 14", "words {w} completed 43"}
	if d := pgtest.Diff(want, pgtest.Rows(t, env.Target, ledger)); d != "" {
		t.Errorf("ledger of the second run (table, plan, status, chunks): %s", d)
	}
}

// A backfill of tables the daemon streams, with four workers, while the pgbench-like workload
// writes: the tables end equal, and rows the stream had already brought newer are suppressed.
func TestBackfillWhileStreamingUnderLoad(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	setupCrashTables(t, env)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	stopWorkload := workload(t, env)
	defer stopWorkload()
	cfg := testBackfillConfig(t, env, "public.acct", "public.ledger")
	cfg.Workers, cfg.ChunkRows = 4, 500
	var rep backfillrun.Report
	for i := 0; i < 2; i++ { // the second one finds every key present and merges
		rep = backfillNow(t, cfg)
		if rep.Result.Applied+rep.Result.Suppressed != rep.Rows {
			t.Errorf("run %d: applied %d + suppressed %d != rows %d", rep.RunID, rep.Result.Applied, rep.Result.Suppressed, rep.Rows)
		}
	}
	t.Logf("last run: %d rows, %d applied, %d suppressed", rep.Rows, rep.Result.Applied, rep.Result.Suppressed)
	stopWorkload()
	pgtest.WaitConverged(t, env, "acct", "id")
	pgtest.WaitConverged(t, env, "ledger", "id")
	got := pgtest.Rows(t, env.Target, `select trigger || ' ' || status || ' ' || count(*) from pgconverge.backfill_runs group by trigger, status order by 1`)
	if d := pgtest.Diff([]string{"initial completed 1", "manual completed 2"}, got); d != "" {
		t.Errorf("runs: %s", d)
	}
}

// A backfill killed with SIGKILL after some chunks resumes when the same command runs again, next
// to the daemon that streams the table: the completed chunks keep their snapshot LSN, the others
// are read at a new one, nothing is lost, and the changes made in between (in kept chunks too)
// arrive through the stream.
func TestBackfillResumesAfterKill(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id bigint primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	child := crashChildCmd(env, "backfill-chunk", 5)
	out, err := child.CombinedOutput()
	requireKilled(t, err, out)
	pgtest.Exec(t, env.Source, `delete from big where id % 1000 = 0`, `update big set v = 'changed' where id % 999 = 0`,
		`insert into big values (20001, 'new')`)
	pgtest.Eventually(t, 30*time.Second, "the killed run's temporary slot is gone", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where slot_name like 'pgconverge_snap_%' and database = current_database()`)
		return n == 0, fmt.Sprintf("%d temporary slots", n)
	})
	rep := backfillNow(t, testBackfillConfig(t, env, "public.big"))
	// Kept: the 5 chunks of 1,000 rows completed before the kill. Read: ids 5001..20000 less the
	// 15 deleted there, plus the new row.
	if rep.Kept != 5000 || rep.Rows != 14986 {
		t.Errorf("kept %d rows and read %d, want 5000 and 14986", rep.Kept, rep.Rows)
	}
	t.Logf("resumed: kept %d rows, read %d, of which %d again", rep.Kept, rep.Rows, rep.Reread)
	pgtest.WaitConverged(t, env, "big", "id")
	got := pgtest.Rows(t, env.Target, `select count(distinct c.snapshot_lsn)::text || ' ' || count(*) filter (where c.snapshot_lsn is null)::text
from pgconverge.backfill_chunks c join pgconverge.backfills b on b.id = c.backfill_id join pgconverge.backfill_runs r on r.id = b.run_id
where r.trigger = 'manual'`)
	if d := pgtest.Diff([]string{"2 0"}, got); d != "" {
		t.Errorf("chunks (distinct snapshot LSNs, not completed): %s", d)
	}
	got = pgtest.Rows(t, env.Target, `select status || ' ' || coalesce(error, '') from pgconverge.backfill_runs where trigger = 'manual' order by id`)
	if len(got) != 2 || !strings.HasPrefix(got[0], "failed interrupted") || got[1] != "completed " {
		t.Errorf("runs = %q, want the killed one failed (interrupted) and the resumed one completed", got)
	}
}

// backfillCrashChild runs `pgconverge backfill` of public.big with one worker and SIGKILLs
// itself: at point "backfill-chunk" after chunk at (of 1,000 rows) completed, at
// "backfill-batch" after merged batch at (chunks of 100,000 rows) committed.
func backfillCrashChild(point string, at int) int {
	var mu sync.Mutex
	n := 0
	hit := func() {
		mu.Lock()
		defer mu.Unlock()
		if n++; n == at {
			kill()
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	tables := []string{"public.big"}
	if v := os.Getenv("PGCONVERGE_CRASH_TABLES"); v != "" {
		tables = strings.Split(v, ",")
	}
	cfg := operator.BackfillConfig{
		Source: os.Getenv(envCrashSrc), Target: os.Getenv(envCrashTgt), Tables: tables,
		Workers: 1, ChunkRows: 1000, Resume: true, Logger: log, Progress: backfillrun.NewLogProgress(log, "backfill", time.Hour),
		AfterChunk: func(string, int64) { hit() }, Lease: childLease(),
	}
	if point == "backfill-batch" {
		cfg.ChunkRows, cfg.AfterChunk, cfg.AfterMergedBatch = 100_000, nil, hit
	}
	if v, err := strconv.Atoi(os.Getenv(envCrashChunkRows)); err == nil {
		cfg.ChunkRows = v
	}
	_, err := operator.Backfill(context.Background(), cfg)
	fmt.Fprintf(os.Stderr, "backfill child reached the end without crashing: %v\n", err)
	return 3
}

// A second backfill of a table refuses while one runs, naming the table; a cancelled run (as by
// SIGTERM) is recorded as interrupted and leaves no temporary slot behind.
func TestBackfillGuardRails(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table g (id int primary key)`, `insert into g select generate_series(1, 5000)`)
	holder := pgtest.Connect(t, env.TargetURL)
	tab := changebatch.Table{TableName: changebatch.TableName{Schema: "public", Name: "g"}}
	if ok, err := coverage.LockBackfill(context.Background(), holder, tab.TableName, false); err != nil || !ok {
		t.Fatalf("take the lock: %v %v", ok, err)
	}
	_, err := operator.Backfill(context.Background(), testBackfillConfig(t, env, "public.g"))
	if err == nil || !strings.Contains(err.Error(), "another backfill of public.g is running") {
		t.Errorf("second backfill: %v, want a refusal naming public.g", err)
	}
	if err := coverage.UnlockBackfill(context.Background(), holder, tab.TableName); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cfg := testBackfillConfig(t, env, "public.g")
	cfg.Workers = 1
	cfg.AfterChunk = func(string, int64) { cancel() }
	if _, err := operator.Backfill(ctx, cfg); err == nil {
		t.Fatal("cancelled backfill succeeded")
	}
	pgtest.Eventually(t, 30*time.Second, "no temporary slot left after a cancelled run", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where slot_name like 'pgconverge_snap_%' and database = current_database()`)
		return n == 0, fmt.Sprintf("%d temporary slots", n)
	})
	got := pgtest.Rows(t, env.Target, `select status from pgconverge.backfill_runs order by id`)
	if d := pgtest.Diff([]string{"interrupted"}, got); d != "" {
		t.Errorf("runs: %s", d)
	}
	backfillNow(t, testBackfillConfig(t, env, "public.g"))
	pgtest.WaitConverged(t, env, "g", "id")
}

// A backfill killed after some chunks is not resumed into a target table that was dropped (or
// truncated) since: its completed chunks are gone with the table, so everything is read again.
func TestBackfillNotResumedIntoANewTable(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id bigint primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`)
	out, err := crashChildCmd(env, "backfill-chunk", 5).CombinedOutput()
	requireKilled(t, err, out)
	pgtest.Exec(t, env.Target, `truncate big`)
	rep := backfillNow(t, testBackfillConfig(t, env, "public.big"))
	if rep.Kept != 0 || rep.Rows != 20000 {
		t.Errorf("kept %d rows and read %d, want 0 and 20000", rep.Kept, rep.Rows)
	}
	pgtest.WaitConverged(t, env, "big", "id")
	got := pgtest.Rows(t, env.Target, `select status from pgconverge.backfills order by id`)
	if d := pgtest.Diff([]string{"abandoned", "completed"}, got); d != "" {
		t.Errorf("table backfills: %s", d)
	}
}

// A repair backfill (the target holds the rows, so chunks are merged batch by batch) killed after
// its first merged batch resumes after that batch's last key: the batch is kept, the rest is read
// again, and the table ends equal.
func TestRepairResumesInsideAChunk(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id bigint primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 25000) g`)
	backfillNow(t, testBackfillConfig(t, env, "public.big"))
	pgtest.Exec(t, env.Source, `update big set v = 'repaired' where id % 7 = 0`, `delete from big where id % 1000 = 1`)
	out, err := crashChildCmd(env, "backfill-batch", 1).CombinedOutput()
	requireKilled(t, err, out)
	got := pgtest.Rows(t, env.Target, `select array_to_string(done_key, ',') || ' ' || done_rows from pgconverge.backfill_chunks
where completed_at is null`)
	// The first batch is the first 10,000 ids left: 1..10011 less the 11 deleted (1, 1001, …, 10001).
	if d := pgtest.Diff([]string{"10011 10000"}, got); d != "" {
		t.Fatalf("chunk progress after the kill (done_key, done_rows): %s", d)
	}
	rep := backfillNow(t, testBackfillConfig(t, env, "public.big"))
	if rep.Kept != 10000 || rep.Rows != 24975-10000 {
		t.Errorf("kept %d rows and read %d, want 10000 and 14975", rep.Kept, rep.Rows)
	}
	pgtest.WaitConverged(t, env, "big", "id")
	got = pgtest.Rows(t, env.Target, `select count(*) || ' ' || count(*) filter (where done_key is not null or completed_at is null)
from pgconverge.backfill_chunks c join pgconverge.backfills b on b.id = c.backfill_id where b.status = 'completed' and b.id = (select max(id) from pgconverge.backfills)`)
	if d := pgtest.Diff([]string{"1 0"}, got); d != "" {
		t.Errorf("chunks of the resumed backfill (all, open): %s", d)
	}
}
