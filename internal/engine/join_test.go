package engine_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/operator"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// joinNow runs backfillrun.Join with w workers in a goroutine, waiting for a run to join; its result arrives
// on the returned channel.
func joinNow(t *testing.T, env *pgtest.Env, w int) <-chan joinOutcome {
	t.Helper()
	done := make(chan joinOutcome, 1)
	log := testConfig(t, env).Logger.With("process", "joined")
	go func() {
		rep, err := backfillrun.Join(context.Background(), backfillrun.JoinConfig{Source: env.SourceURL, Target: env.TargetURL, Workers: w, Wait: true, Logger: log})
		done <- joinOutcome{rep, err}
	}()
	return done
}

type joinOutcome struct {
	rep backfillrun.JoinReport
	err error
}

// waitJoin returns the outcome of a backfillrun.Join, failing the test when it failed or took over 60 s.
func waitJoin(t *testing.T, done <-chan joinOutcome) backfillrun.JoinReport {
	t.Helper()
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatalf("join: %v", o.err)
		}
		return o.rep
	case <-time.After(60 * time.Second):
		t.Fatal("join did not end within 60 s")
		return backfillrun.JoinReport{}
	}
}

// A bulk load (the target table empty, its key deferred, cut by blocks) shared by the run's one
// worker and two workers of a joined process: while the run's own worker is held after its first
// chunk, the joined workers complete others. Every chunk is applied exactly once (one claim each),
// at the run's snapshot; the rows of both processes add up to the table; the key is rebuilt and
// the tables are equal.
func TestJoinedWorkersShareARun(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`, `analyze big`)
	joined := joinNow(t, env, 2)
	cfg := testBackfillConfig(t, env, "public.big")
	cfg.Workers = 1
	var once sync.Once
	var hookErr error
	cfg.AfterChunk = func(string, int64) {
		once.Do(func() {
			tgt := pgtest.Connect(t, env.TargetURL)
			deadline := time.Now().Add(60 * time.Second)
			for {
				var n int
				if err := tgt.QueryRow(context.Background(), `select count(*) from pgconverge.backfill_chunks where completed_at is not null`).Scan(&n); err != nil {
					hookErr = err
					return
				}
				if n >= 4 {
					return
				}
				select {
				case o := <-joined:
					hookErr = fmt.Errorf("the joined process ended after %d chunks while the run's worker was held: %v", o.rep.Chunks, o.err)
					return
				default:
				}
				if time.Now().After(deadline) {
					hookErr = fmt.Errorf("only %d chunks completed while the run's own worker was held", n)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	rep := backfillNow(t, cfg)
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	jrep := waitJoin(t, joined)
	if jrep.RunID != rep.RunID || jrep.Chunks < 3 || jrep.Rows != rep.Joined {
		t.Errorf("joined process: run %d, %d chunks, %d rows; want run %d, at least 3 chunks, the %d rows the run counts as joined",
			jrep.RunID, jrep.Chunks, jrep.Rows, rep.RunID, rep.Joined)
	}
	if rep.Rows+rep.Joined != 20000 {
		t.Errorf("rows: %d by the run's worker + %d by the joined ones, want 20000", rep.Rows, rep.Joined)
	}
	got := pgtest.Rows(t, env.Target, `select count(*)::text || ' chunks, attempts ' || min(attempts) || '-' || max(attempts)
  || ', at the run snapshot ' || bool_and(snapshot_lsn = '`+rep.Snapshot.String()+`')::text || ', completed ' || bool_and(completed_at is not null)::text
from pgconverge.backfill_chunks`)
	if len(got) != 1 || !strings.Contains(got[0], "attempts 1-1, at the run snapshot true, completed true") {
		t.Errorf("ledger: %v, want every chunk claimed once, at the run's snapshot, completed", got)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_index where indrelid = 'big'::regclass and indisprimary`); n != 1 {
		t.Errorf("the bulk load's deferred primary key: %d, want 1 rebuilt", n)
	}
	pgtest.WaitConverged(t, env, "big", "id")
}

// A chunk a joined worker claimed and then abandoned (its session ended, as when its process is
// killed) is applied by the run itself: the run waits for it while the claim stands, then claims
// it; the tables end equal.
func TestChunkOfAnEndedJoinerIsTakenOver(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 5000) g`)
	backfillNow(t, testBackfillConfig(t, env, "public.big")) // a bulk load: the next run cuts keyed chunks
	pgtest.Exec(t, env.Source, `update big set v = 'again' where id % 10 = 0`)
	cfg := testBackfillConfig(t, env, "public.big")
	cfg.Workers = 1
	var logs pgtest.SyncBuffer
	cfg.Logger = newTestLogger(t, &logs)
	joiner := pgtest.Connect(t, env.TargetURL)
	if err := coverage.HoldWorkerLock(context.Background(), joiner); err != nil {
		t.Fatal(err)
	}
	var claimed *coverage.ClaimedChunk
	var claimErr error
	var once sync.Once
	cfg.AfterChunk = func(string, int64) {
		once.Do(func() {
			var run int64
			if claimErr = joiner.QueryRow(context.Background(), `select max(id) from pgconverge.backfill_runs`).Scan(&run); claimErr == nil {
				claimed, claimErr = coverage.ClaimAnyChunk(context.Background(), joiner, run)
			}
		})
	}
	wait, _ := backfillInBackground(t, cfg)
	pgtest.Eventually(t, 60*time.Second, "the run waits for the chunk the joiner holds", func() (bool, string) {
		return strings.Contains(logs.String(), "waiting for the chunks workers of joined processes are applying"), ""
	})
	if claimErr != nil || claimed == nil {
		t.Fatalf("the joiner's claim: %v, %v", claimed, claimErr)
	}
	joiner.Close(context.Background()) // the claim lapses with the session
	rep, err := wait()
	if err != nil {
		t.Fatalf("backfill: %v", err)
	}
	if rep.Joined != 0 {
		t.Errorf("rows counted as joined: %d, want 0 (the joiner applied nothing)", rep.Joined)
	}
	attempts := pgtest.Scalar[int64](t, env.Target, fmt.Sprintf(`select attempts from pgconverge.backfill_chunks where backfill_id = %d and chunk = %d`, claimed.Backfill, claimed.Ordinal))
	if attempts != 2 {
		t.Errorf("attempts at the abandoned chunk %d: %d, want 2 (the joiner's claim, then the run's)", claimed.Ordinal, attempts)
	}
	pgtest.WaitConverged(t, env, "big", "id")
}

// backfillrun.Join refuses clearly when no run is running, and when its source is not the run's.
func TestJoinRefusals(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	log := testConfig(t, env).Logger
	_, err := backfillrun.Join(context.Background(), backfillrun.JoinConfig{Source: env.SourceURL, Target: env.TargetURL, Workers: 1, Logger: log})
	if err == nil || !strings.Contains(err.Error(), "no backfill run is running on the target") || !strings.Contains(err.Error(), "--wait") {
		t.Errorf("join with no run: %v, want a refusal naming --wait", err)
	}
	_, err = backfillrun.Join(context.Background(), backfillrun.JoinConfig{Source: env.SourceURL, Target: env.TargetURL, Workers: 1, Run: 42, Logger: log})
	if err == nil || !strings.Contains(err.Error(), "backfill run 42 is not running") {
		t.Errorf("join of run 42: %v, want a refusal naming run 42", err)
	}
}

// A joined process that freezes (SIGSTOP) while it applies a chunk holds the chunk and the row
// locks of its open transaction only for the lease: the run's process ends its target sessions
// once its heartbeat is silent past lease.Term, takes the chunk over and completes; the thawed
// process finds its sessions ended and says why.
func TestFrozenJoinerIsEndedAfterTheLease(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 200000) g`, `analyze big`)
	joiner, out := startJoiner(t, env)
	cfg := testBackfillConfig(t, env, "public.big")
	cfg.Workers, cfg.ChunkRows, cfg.Lease = 1, 20000, shortLease()
	var logs pgtest.SyncBuffer
	cfg.Logger = newTestLogger(t, &logs)
	frozen := make(chan time.Time, 1)
	var once sync.Once
	cfg.AfterChunk = func(string, int64) {
		once.Do(func() { // the run's own worker waits here until the joiner is frozen mid-chunk
			mon := pgtest.Connect(t, env.TargetURL)
			defer mon.Close(context.Background())
			holding := `select exists (select 1 from pgconverge.backfill_chunks c join pgconverge.backfill_workers w on w.pid = c.claimed_by and w.joined
  where c.completed_at is null)`
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				var busy bool
				if mon.QueryRow(context.Background(), holding).Scan(&busy) != nil || !busy {
					continue
				}
				joiner.Process.Signal(syscall.SIGSTOP)
				if mon.QueryRow(context.Background(), holding).Scan(&busy) == nil && busy {
					frozen <- time.Now()
					return
				}
				joiner.Process.Signal(syscall.SIGCONT) // it completed the chunk meanwhile: try again
			}
			close(frozen)
		})
	}
	rep := backfillNow(t, cfg)
	frozenAt, ok := <-frozen
	if !ok {
		t.Fatal("the joiner never held a chunk to freeze it on")
	}
	took := time.Since(frozenAt)
	if !strings.Contains(logs.String(), "ended the target session of a joined backfill worker silent past the lease") {
		t.Errorf("no WARN of the frozen joiner's session ended by the run")
	}
	if term := shortLease().Term; took < term-shortLease().CheckEvery {
		t.Errorf("the run completed %s after the joiner froze, before the lease of %s ran out", took, term)
	}
	t.Logf("the run completed %s after the joiner froze; rows by the joiner %d, by the run %d", took.Round(time.Millisecond), rep.Joined, rep.Rows)
	if rep.Rows+rep.Joined != 200000 {
		t.Errorf("rows: %d by the run + %d joined, want 200000", rep.Rows, rep.Joined)
	}
	pgtest.WaitConverged(t, env, "big", "id")
	joiner.Process.Signal(syscall.SIGCONT)
	pgtest.Eventually(t, 30*time.Second, "the thawed joiner says its session was ended", func() (bool, string) {
		return strings.Contains(out.String(), "was this process stopped, or its host cut off?"), ""
	})
}

// A joined process frozen inside a chunk transaction, whose run then ends (cancelled), holds row
// locks the stream needs and the row the run's end records; no run watches it any more, but the
// streaming daemon does: it ends the frozen process's sessions after the lease, the run's end is
// recorded and the stream goes on.
func TestFrozenJoinerOfAnEndedRunIsEndedByTheDaemon(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 200000) g`, `analyze big`)
	dcfg := testConfig(t, env)
	dcfg.Knobs.Lease = shortLease()
	var dlogs pgtest.SyncBuffer
	dcfg.Logger = newTestLogger(t, &dlogs)
	d := startDaemon(t, dcfg)
	pgtest.WaitStreaming(t, env)
	pgtest.WaitConverged(t, env, "big", "id")
	joiner, _ := startJoiner(t, env)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := testBackfillConfig(t, env, "public.big")
	cfg.Workers, cfg.ChunkRows, cfg.Lease = 1, 20000, shortLease()
	var once sync.Once
	var held []int64 // the key range of the chunk the frozen joiner holds
	var frozenAt time.Time
	cfg.AfterChunk = func(string, int64) {
		once.Do(func() { // freeze the joiner inside a write transaction of a chunk, then end the run
			defer cancel()
			mon := pgtest.Connect(t, env.TargetURL)
			defer mon.Close(context.Background())
			writing := `select c.lower_key[1]::bigint, c.upper_key[1]::bigint from pgconverge.backfill_chunks c
  join pgconverge.backfill_workers w on w.pid = c.claimed_by and w.joined join pg_stat_activity a on a.pid = w.pid
  where c.completed_at is null and a.backend_xid is not null and c.lower_key is not null and c.upper_key is not null limit 1`
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
				var lo, hi int64
				if mon.QueryRow(context.Background(), writing).Scan(&lo, &hi) != nil {
					continue
				}
				joiner.Process.Signal(syscall.SIGSTOP)
				if mon.QueryRow(context.Background(), writing).Scan(&lo, &hi) == nil {
					held, frozenAt = []int64{lo, hi}, time.Now()
					return
				}
				joiner.Process.Signal(syscall.SIGCONT)
			}
		})
	}
	// The cancelled run's end waits for the frozen joiner too (its chunk transaction holds the
	// table backfill's row): without the daemon's watch this never returns.
	if _, err := operator.Backfill(ctx, cfg); err == nil {
		t.Fatal("the cancelled backfill succeeded")
	}
	if held == nil {
		t.Fatal("the joiner never held a chunk's rows to freeze it on")
	}
	pgtest.Exec(t, env.Source, fmt.Sprintf(`update big set v = 'after the freeze' where id > %d and id <= %d`, held[0], held[1]))
	pgtest.WaitConverged(t, env, "big", "id")
	t.Logf("the stream applied the rows the frozen joiner held %s after the freeze", time.Since(frozenAt).Round(time.Millisecond))
	if !strings.Contains(dlogs.String(), "ended the target session of a joined backfill worker silent past the lease") {
		t.Errorf("the daemon did not log that it ended the frozen joiner's session")
	}
	d.RequireRunning(t)
}

// A process joined to a daemon's run whose slot another daemon took over (its epoch raised while
// the run still runs) applies nothing at the old epoch: it leaves the run saying the daemon that
// runs it lost the slot, not that it lost a leader lock itself, and the run is not completed.
func TestJoinerOfAFencedDaemonsRunLeaves(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`, `analyze big`)
	cfg := testConfig(t, env)
	cfg.BackfillWorkers = 1
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cfg.Knobs.AfterLoadChunk = func(string, int64) {
		once.Do(func() { close(held); <-release })
	}
	startDaemon(t, cfg)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		t.Fatal("the initial load applied no chunk within 60 s")
	}
	pgtest.Exec(t, env.Target, fmt.Sprintf(`update pgconverge.leaders set epoch = epoch + 1, holder = 'a test standing in for a new leader' where slot = '%s'`, env.Name))
	jrep := waitJoin(t, joinNow(t, env, 1))
	close(release)
	want := `the daemon that runs it lost the leadership of slot "` + env.Name + `" to a test standing in for a new leader (epoch 2 after the run's 1)`
	if jrep.Completed || jrep.Chunks != 0 || !strings.Contains(jrep.Ended, want) {
		t.Errorf("joined process: %d chunks, completed %v, left because %q; want no chunk, not completed, because %s", jrep.Chunks, jrep.Completed, jrep.Ended, want)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_chunks where completed_at is not null`); n != 1 {
		t.Errorf("%d chunks completed, want only the one before the takeover", n)
	}
}
