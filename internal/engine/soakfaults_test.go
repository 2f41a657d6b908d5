package engine_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/backfillrun"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// envSoakJoin makes a child process of the test binary the soak's joined backfill worker.
const envSoakJoin = "PGCONVERGE_SOAK_JOIN"

// soakJoinChild joins every backfill run of the soak's daemon (backfillrun.Join, one worker, waiting for each
// run to start) until it is killed; it returns only on a signal.
func soakJoinChild() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("process", "joined")
	for {
		_, err := backfillrun.Join(context.Background(), backfillrun.JoinConfig{Source: os.Getenv(envCrashSrc), Target: os.Getenv(envCrashTgt), Workers: 1, Wait: true, Logger: log, Lease: childLease()})
		if err != nil {
			log.Error("join failed", "err", err)
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// soakJoiner is the soak's joined worker process, killed and started again as a fault.
type soakJoiner struct {
	t        *testing.T
	src, tgt string
	cmd      *exec.Cmd
	out      *pgtest.SyncBuffer
}

func (j *soakJoiner) start() {
	j.cmd = joinerCmd(j.src, j.tgt, j.out)
	if err := j.cmd.Start(); err != nil {
		j.t.Fatal(err)
	}
}

// joinerCmd returns the command that runs soakJoinChild against source src and target tgt in a
// child process of the test binary, its output going to out, with env added to its environment.
func joinerCmd(src, tgt string, out *pgtest.SyncBuffer, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envSoakJoin+"=1", envCrashSrc+"="+src, envCrashTgt+"="+tgt), env...)
	cmd.Stdout, cmd.Stderr = out, out
	return cmd
}

// startJoiner starts joinerCmd for env's databases, on the tests' short lease (shortLease: the
// tests that start it freeze it and wait for its lease to run out); at cleanup it is thawed (it
// may be stopped) and killed, and its output logged when the test failed.
func startJoiner(t *testing.T, env *pgtest.Env) (*exec.Cmd, *pgtest.SyncBuffer) {
	t.Helper()
	out := &pgtest.SyncBuffer{}
	cmd := joinerCmd(env.SourceURL, env.TargetURL, out, envShortLease+"=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("the joined process's output:\n%s", out)
		}
	})
	return cmd, out
}

func (j *soakJoiner) kill() {
	j.cmd.Process.Signal(syscall.SIGKILL)
	j.cmd.Wait()
}

// joinedRows sums the rows the daemon's backfill runs counted as applied by joined workers.
func joinedRows(daemonLog string) int64 {
	var n int64
	for _, m := range regexp.MustCompile(`rows_by_joined_workers=(\d+)`).FindAllStringSubmatch(daemonLog, -1) {
		v, _ := strconv.ParseInt(m[1], 10, 64)
		n += v
	}
	return n
}

// injectDeadlock makes the daemon's next waiting write transaction lose a deadlock against a
// target session of the test's: the session locks acct's last 100 rows, waits up to 3 s for a
// daemon transaction (a stream group, a backfill chunk or a repair) to wait for one of them, then
// asks for a row that transaction already wrote, which closes the cycle. The daemon's
// transaction waited first and checks first (the session's deadlock_timeout is 10 s), so
// PostgreSQL ends it with 40P01. It returns whether the cycle was closed; no data of the session
// is ever written.
func injectDeadlock(t *testing.T, targetURL string) bool {
	t.Helper()
	ctx := context.Background()
	conn := pgtest.Connect(t, targetURL)
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var xid string
	if err := tx.QueryRow(ctx, `select pg_current_xact_id()::text from (select 1 from acct where id > 1900 for update) as l limit 1`).Scan(&xid); err != nil {
		t.Fatalf("deadlock fault: lock acct's last rows: %v", err)
	}
	pgtest.Exec(t, tx.Conn(), `set local deadlock_timeout = '10s'`, `set local statement_timeout = '20s'`)
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var held *int64
		err := tx.QueryRow(ctx, `with waiter as (
  select w.pid from pg_locks w where w.locktype = 'transactionid' and w.transactionid::text = $1 and not w.granted limit 1),
own as (
  select o.transactionid::text as xid from pg_locks o join waiter using (pid) where o.locktype = 'transactionid' and o.granted)
select (select a.id from acct a, own where a.xmax::text = own.xid and a.id <= 1900 limit 1)`, xid).Scan(&held)
		if err != nil {
			t.Fatalf("deadlock fault: look for a waiting daemon transaction: %v", err)
		}
		if held != nil {
			// Returns once PostgreSQL ended the daemon's transaction and the row is free.
			_, err := tx.Exec(ctx, `select 1 from acct where id = $1 for update`, *held)
			return err == nil
		}
	}
	return false
}
