package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/lease"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/migrations"
)

// A `pgconverge backfill` process frozen (SIGSTOP) inside a chunk's write transaction holds row
// locks the stream needs and shows its run as running. The streaming daemon ends its target
// sessions once its lease lapsed: the stream applies the rows it waited for, the run no longer
// runs, the thawed process exits saying its session was ended, and the next run resumes the table.
func TestFrozenBackfillRunIsEndedByTheDaemon(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 200000) g`, `analyze big`)
	var dlogs pgtest.SyncBuffer
	dcfg := testConfig(t, env)
	dcfg.Logger = newTestLogger(t, &dlogs)
	dcfg.Knobs.Lease = shortLease()
	startDaemon(t, dcfg)
	pgtest.WaitStreaming(t, env)
	pgtest.WaitConverged(t, env, "big", "id")
	child := crashChildCmd(env, "backfill-chunk", 1<<30) // never killed by itself
	child.Env = append(child.Env, envCrashChunkRows+"=20000", envShortLease+"=1")
	out := &pgtest.SyncBuffer{}
	child.Stdout, child.Stderr = out, out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = child.Wait(); close(exited) }()
	t.Cleanup(func() {
		child.Process.Signal(syscall.SIGCONT)
		child.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("the backfill process's output:\n%s", out)
		}
	})
	// Freeze the process while one of its workers holds the row locks of a chunk it merges.
	mon := pgtest.Connect(t, env.TargetURL)
	writing := `select c.lower_key[1]::bigint, c.upper_key[1]::bigint, w.run_id from pgconverge.backfill_chunks c
  join pgconverge.backfill_workers w on w.pid = c.claimed_by and not w.joined join pg_stat_activity a on a.pid = w.pid
  where c.completed_at is null and a.backend_xid is not null and c.lower_key is not null and c.upper_key is not null limit 1`
	var lo, hi, run int64
	var frozenAt time.Time
	for deadline := time.Now().Add(60 * time.Second); frozenAt.IsZero(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the backfill process never held a chunk's rows to freeze it on")
		}
		if mon.QueryRow(context.Background(), writing).Scan(&lo, &hi, &run) != nil {
			continue
		}
		child.Process.Signal(syscall.SIGSTOP)
		if rowsLocked(t, mon, lo, hi) {
			frozenAt = time.Now()
		} else {
			child.Process.Signal(syscall.SIGCONT) // it had not merged yet, or completed: try again
		}
	}
	pgtest.Exec(t, env.Source, fmt.Sprintf(`update big set v = 'after the freeze' where id > %d and id <= %d`, lo, hi))
	pgtest.WaitConverged(t, env, "big", "id")
	took := time.Since(frozenAt)
	t.Logf("the stream applied the rows the frozen run held %s after the freeze", took.Round(time.Millisecond))
	if term := shortLease().Term; took < term-shortLease().CheckEvery {
		t.Errorf("the stream applied the held rows %s after the freeze, before the lease of %s ran out", took, term)
	}
	if !strings.Contains(dlogs.String(), "ended a target session of a backfill run's process silent past the lease") {
		t.Errorf("no WARN of the frozen run's sessions ended by the daemon")
	}
	if _, running, err := coverage.RunState(context.Background(), env.Target, run); err != nil || running {
		t.Errorf("backfill run %d running %v (%v), want not running once its process's sessions were ended", run, running, err)
	}
	child.Process.Signal(syscall.SIGCONT)
	select {
	case <-exited:
		if !strings.Contains(out.String(), "a target session of this run was ended") {
			t.Errorf("the thawed backfill process exited (%v) without saying its session was ended", exitErr)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		t.Logf("the thawed backfill process ended with: %s", lines[len(lines)-1])
	case <-time.After(60 * time.Second):
		t.Fatal("the thawed backfill process did not exit within 60 s")
	}
	rep := backfillNow(t, testBackfillConfig(t, env, "public.big"))
	if rep.Kept == 0 {
		t.Errorf("the next run kept no chunk of the frozen one, want it resumed")
	}
	pgtest.WaitConverged(t, env, "big", "id")
}

// rowsLocked reports whether another transaction holds a row lock on a row of big with id in
// (lo, hi].
func rowsLocked(t *testing.T, conn *pgx.Conn, lo, hi int64) bool {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var free, all int64
	err = tx.QueryRow(ctx, `select (select count(*) from (select from big where id > $1 and id <= $2 for update skip locked) f),
  (select count(*) from big where id > $1 and id <= $2)`, lo, hi).Scan(&free, &all)
	if err != nil {
		t.Fatal(err)
	}
	return free < all
}

// A backfill process never ends its own sessions, however stale their heartbeat looks (as after
// the process itself was paused past the lease): while its sessions' rows are kept 20 s old, its
// own lease checks run and the run completes.
func TestRunDoesNotEndItsOwnSessions(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`, `analyze big`)
	cfg := testBackfillConfig(t, env, "public.big")
	cfg.Workers = 1
	var logs pgtest.SyncBuffer
	cfg.Logger = newTestLogger(t, &logs)
	var once sync.Once
	var staleErr error
	cfg.AfterChunk = func(string, int64) {
		once.Do(func() {
			tgt := pgtest.Connect(t, env.TargetURL)
			defer tgt.Close(context.Background())
			// Three lease checks of the run's own process see its sessions silent.
			for end := time.Now().Add(3*lease.CheckEvery + time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				if _, staleErr = tgt.Exec(context.Background(), `update pgconverge.backfill_workers set seen_at = clock_timestamp() - interval '20 s'`); staleErr != nil {
					return
				}
			}
		})
	}
	rep := backfillNow(t, cfg)
	if staleErr != nil {
		t.Fatal(staleErr)
	}
	if strings.Contains(logs.String(), "silent past the lease") || rep.Rows != 20000 {
		t.Errorf("the run ended sessions (its own) or read %d rows, want none ended and 20000 rows:\n%s", rep.Rows, logs.String())
	}
	pgtest.WaitConverged(t, env, "big", "id")
}

// A silent backfill session the target role may not end (a superuser's) is reported as refused
// and does not keep the lease check from ending the silent sessions it may end.
func TestLeaseEndsWhatTheRoleMaySignal(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	role := env.Name + "_tgt"
	tempRole(t, env, false, role, "", `grant create on database `+env.Name+` to `+role, `grant pg_read_all_stats to `+role)
	watcher := pgtest.Connect(t, withUser(t, env.TargetURL, role))
	if err := migrations.Apply(t.Context(), watcher); err != nil {
		t.Fatal(err)
	}
	super, own := pgtest.Connect(t, env.TargetURL), pgtest.Connect(t, withUser(t, env.TargetURL, role))
	for i, c := range []*pgx.Conn{super, own} {
		if err := coverage.RegisterWorker(t.Context(), c, 1, fmt.Sprintf("host %d", i), true); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.Exec(t, env.Target, `update pgconverge.backfill_workers set seen_at = clock_timestamp() - interval '1 min'`)
	got, err := coverage.EndSilentWorkers(t.Context(), watcher, lease.Term, "this host")
	if err != nil {
		t.Fatal(err)
	}
	var report []string
	for _, w := range got {
		report = append(report, fmt.Sprintf("%s refused=%v", w.Host, w.Refused != nil))
	}
	slices.Sort(report)
	if d := pgtest.Diff([]string{"host 0 refused=true", "host 1 refused=false"}, report); d != "" {
		t.Errorf("silent sessions: %s", d)
	}
	if err := own.Ping(t.Context()); err == nil {
		t.Errorf("the role's own silent session was not ended")
	}
	if err := super.Ping(t.Context()); err != nil {
		t.Errorf("the superuser's session was ended: %v", err)
	}
}
