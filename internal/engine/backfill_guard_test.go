package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/operator"

	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/internal/advisory"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// A TRUNCATE on the source while a backfill of the table runs gets its lock between two chunks
// (the planner holds no lock while it waits). The snapshot cannot see the truncated table's rows
// any more, so the backfill stops (it would read it empty) and a second run resumes it from a new
// snapshot; with the stream following the table, the target converges.
func TestBackfillLetsSourceDDLThrough(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	cfg := testBackfillConfig(t, env, "public.big")
	cfg.ChunkRows = 500
	end := backfillAfterFirstChunkEnd(t, cfg, false)
	// Without the fix the planner's idle transaction held its lock until the end, and the
	// TRUNCATE, and the chunk readers queued behind it, waited forever.
	pgtest.Exec(t, env.Source, `set lock_timeout = '30s'`, `truncate big`, `insert into big values (1, 'after the truncate')`)
	if _, err := end(); err != nil && !errors.Is(err, backfill.ErrRewritten) {
		t.Fatalf("backfill: %v, want success or %v", err, backfill.ErrRewritten)
	}
	backfillNow(t, cfg)
	pgtest.WaitConverged(t, env, "big", "id")
}

// A table-rewriting ALTER TABLE on the source while a backfill runs: the old snapshot would read
// the rest of the table as empty, and the stream carries nothing for a rewrite. The backfill must
// stop rather than tombstone the rows it could not see; run again, it completes.
func TestBackfillStopsOnARewrittenTable(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "big", "id")
	cfg := testBackfillConfig(t, env, "public.big")
	cfg.ChunkRows = 500
	end := backfillAfterFirstChunkEnd(t, cfg, false)
	pgtest.Exec(t, env.Source, `set lock_timeout = '30s'`, `alter table big alter column v type varchar(100)`)
	if _, err := end(); !errors.Is(err, backfill.ErrRewritten) {
		t.Fatalf("backfill across a table rewrite: %v, want %v", err, backfill.ErrRewritten)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from big where not _cdc_deleted`); n != 20000 {
		t.Fatalf("%d live target rows after the stopped backfill, want 20000", n)
	}
	backfillNow(t, cfg)
	pgtest.WaitConverged(t, env, "big", "id")
	waitCovered(t, env)
}

// Runs left "running" by a process that died before recording their end are closed as failed
// when the next run starts; a live run (its process holds its lock) is left alone.
func TestStaleRunsAreClosed(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table g (id int primary key)`, `insert into g values (1)`)
	backfillNow(t, testBackfillConfig(t, env, "public.g"))
	pgtest.Exec(t, env.Target, `insert into pgconverge.backfill_runs (trigger, status, workers, chunk_rows) values ('manual', 'running', 1, 1)`)
	backfillNow(t, testBackfillConfig(t, env, "public.g"))
	got := pgtest.Rows(t, env.Target, `select status || ' ' || coalesce(error, '') from pgconverge.backfill_runs order by id`)
	want := []string{"completed ", "failed interrupted: the process ended without recording the end of the run", "completed "}
	if d := pgtest.Diff(want, got); d != "" {
		t.Errorf("runs: %s", d)
	}
}

// A source whose idle_in_transaction_session_timeout is shorter than a backfill does not end the
// session that holds the exported snapshot, nor the chunk readers.
func TestBackfillOutlivesIdleInTransactionTimeout(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table g (id int primary key)`, `insert into g select generate_series(1, 3000)`,
		fmt.Sprintf(`alter database %q set idle_in_transaction_session_timeout = '1s'`, env.Name))
	cfg := testBackfillConfig(t, env, "public.g")
	cfg.Workers = 1
	finish := backfillAfterFirstChunk(t, cfg, true)
	// Hold the run until a session of it has been idle in its transaction for 2 s.
	pgtest.Eventually(t, 30*time.Second, "a session idle in transaction for 2 s", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_stat_activity
where datname = current_database() and state like 'idle in transaction%' and now() - state_change > interval '2 s'`)
		return n > 0, fmt.Sprintf("%d such sessions", n)
	})
	finish()
	pgtest.WaitConverged(t, env, "g", "id")
}

// Without a stream, chunks read before a TRUNCATE would hold rows the source no longer has: the
// run stopped by the rewrite is abandoned, and running it again starts the table over.
func TestBackfillAfterATruncateStartsOver(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`)
	cfg := testBackfillConfig(t, env, "public.big")
	cfg.ChunkRows = 500
	end := backfillAfterFirstChunkEnd(t, cfg, false)
	pgtest.Exec(t, env.Source, `set lock_timeout = '30s'`, `truncate big`,
		`insert into big select g, 'after' from generate_series(100000, 100300) g`)
	if _, err := end(); !errors.Is(err, backfill.ErrRewritten) {
		t.Fatalf("backfill across a truncate: %v, want %v", err, backfill.ErrRewritten)
	}
	if rep := backfillNow(t, cfg); rep.Kept != 0 {
		t.Errorf("the second run kept %d rows of the stopped one, want 0", rep.Kept)
	}
	pgtest.WaitConverged(t, env, "big", "id")
}

// A backfill that may not wait takes a table's lock that someone holds for one transaction (the
// tombstone pruner does, while it prunes) once that transaction ends, instead of refusing as if
// another backfill ran.
func TestBackfillWaitsOutABriefLockHolder(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table g (id int primary key)`, `insert into g select generate_series(1, 100)`)
	holder := pgtest.Connect(t, env.TargetURL)
	tx, err := holder.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), `select `+advisory.Backfill("'public.g'").XactLock()); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { // the brief holder's transaction
		time.Sleep(time.Second)
		released <- tx.Rollback(context.Background())
	}()
	_, err = operator.Backfill(t.Context(), testBackfillConfig(t, env, "public.g"))
	if rerr := <-released; rerr != nil { // the holder's connection is closed by the test's cleanup: wait for it first
		t.Fatalf("end the holder's transaction: %v", rerr)
	}
	if err != nil {
		t.Fatalf("backfill: %v, want it to take the lock once the holder's transaction ended", err)
	}
	pgtest.WaitConverged(t, env, "g", "id")
}
