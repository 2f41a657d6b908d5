package engine_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/operator"

	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// leaderLocks returns whether a session holds the slot's leader lock (1 or 0) and how many hold
// its standby lock (apply.ReadLeaders), as "1 1"; "0 0" before any daemon led the slot.
func leaderLocks(t *testing.T, env *pgtest.Env) string {
	t.Helper()
	leaders, err := apply.ReadLeaders(context.Background(), env.Target)
	if err != nil {
		t.Fatal(err)
	}
	l := leaders[env.Name]
	alive := 0
	if l.Alive {
		alive = 1
	}
	return fmt.Sprintf("%d %d", alive, l.Standbys)
}

// haPair starts a leader in a child process (the crash child, killed only by the test) under
// the workload, waits until it streams, then starts a standby in this process and waits until it
// waits for the leader lock. With short, both run on the tests' short lease (shortLease), else
// on the production one. It returns the leader's process and output.
func haPair(t *testing.T, env *pgtest.Env, short bool) (*os.Process, *pgtest.SyncBuffer) {
	t.Helper()
	leader := crashChildCmd(env, "none", 0)
	standby := testConfig(t, env)
	if short {
		leader.Env = append(leader.Env, envShortLease+"=1")
		standby.Knobs.Lease = shortLease()
	}
	out := &pgtest.SyncBuffer{}
	leader.Stdout, leader.Stderr = out, out
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leader.Process.Kill(); _ = leader.Wait() })
	t.Cleanup(func() {
		if t.Failed() {
			log := out.String()
			t.Logf("the first leader's output (last 20,000 bytes):\n%s", log[max(0, len(log)-20000):])
		}
	})
	pgtest.WaitStreaming(t, env)
	holder := fmt.Sprintf("pid %d", leader.Process.Pid)
	if l := pgtest.Scalar[string](t, env.Target, `select epoch || ' ' || holder from pgconverge.leaders where slot = $1`, env.Name); !strings.HasPrefix(l, "1 ") || !strings.HasSuffix(l, holder) {
		t.Fatalf("leader row %q, want epoch 1 held by the child (%s)", l, holder)
	}
	startDaemon(t, standby)
	pgtest.Eventually(t, 30*time.Second, "the second daemon waits as a standby", func() (bool, string) {
		l := leaderLocks(t, env)
		return l == "1 1", "leader locks held and waiting: " + l
	})
	rep, err := operator.Status(context.Background(), operator.StatusConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: env.Name})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Slots {
		if l := s.Leader; s.Name == env.Name && (l == nil || !l.Alive || l.Epoch != 1 || l.Standbys != 1 || !strings.HasSuffix(l.Holder, holder)) {
			t.Errorf("status of slot %s: leader %+v, want alive at epoch 1 held by %s with 1 standby", s.Name, l, holder)
		}
	}
	return leader.Process, out
}

// waitTakeover waits until this process leads the slot at epoch and returns how long it took
// from since.
func waitTakeover(t *testing.T, env *pgtest.Env, epoch int, since time.Time) time.Duration {
	t.Helper()
	want := fmt.Sprintf("%d %s", epoch, lease.Holder())
	pgtest.Eventually(t, 60*time.Second, "the standby leads", func() (bool, string) {
		l := pgtest.Scalar[string](t, env.Target, `select epoch || ' ' || holder from pgconverge.leaders where slot = $1`, env.Name)
		return l == want, "leader row " + l
	})
	return time.Since(since)
}

// A standby takes over from a leader killed with SIGKILL under load: nothing is lost or doubled,
// the stream's coverage has no break, and it takes a few seconds at most.
func TestStandbyTakesOverFromAKilledLeader(t *testing.T) {
	env := pgtest.New(t)
	setupCrashTables(t, env)
	stopWorkload := workload(t, env)
	leader, out := haPair(t, env, false)
	killedAt := time.Now()
	if err := leader.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := waitTakeover(t, env, 2, killedAt)
	t.Logf("the standby led %s after the leader's SIGKILL", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("takeover took %s, want a few seconds", took)
	}
	finishUnderNewLeader(t, env, stopWorkload, out)
}

// A leader whose lock connection to the target ends (its other connections live on) stops
// writing and waits as a standby; the standby takes over the lock, the epoch and the slot.
func TestStandbyTakesOverFromALeaderThatLostItsLock(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	setupCrashTables(t, env)
	stopWorkload := workload(t, env)
	leader, out := haPair(t, env, false)
	cutAt := time.Now()
	pid, _, err := apply.LeaderLockHolder(context.Background(), env.Target, env.Name)
	if err != nil || pid == 0 {
		t.Fatalf("the leader lock's holder: %d, %v", pid, err)
	}
	pgtest.Exec(t, env.Target, fmt.Sprintf(`select pg_terminate_backend(%d)`, pid))
	took := waitTakeover(t, env, 2, cutAt)
	t.Logf("the standby led %s after the leader's lock connection ended", took.Round(time.Millisecond))
	// The old leader, alive, now waits for the lock as a standby.
	pgtest.Eventually(t, 30*time.Second, "the old leader waits as a standby", func() (bool, string) {
		l := leaderLocks(t, env)
		return l == "1 1", "leader locks held and waiting: " + l
	})
	if err := leader.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the old leader exited: %v\n%s", err, out)
	}
	finishUnderNewLeader(t, env, stopWorkload, out)
	if !strings.Contains(out.String(), "lost the leadership of the slot") {
		t.Errorf("the old leader did not log that it lost the leadership:\n%s", out)
	}
}

// A leader frozen (SIGSTOP) keeps its lock session, its walsender and its target connections:
// once the lock session was silent for the lease the standby ends it, takes the lock and the
// epoch (ending the frozen leader's transaction that held it off), waits for the slot, ends the
// frozen leader's walsender, and streams; the thawed leader commits nothing and waits as a
// standby.
func TestFrozenLeaderIsFencedAfterATakeover(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	setupCrashTables(t, env)
	stopWorkload := workload(t, env)
	leader, out := haPair(t, env, true)
	oldWalsender := pgtest.Scalar[int32](t, env.Source, `select active_pid from pg_replication_slots where slot_name = $1`, env.Name)
	if err := leader.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	took := waitTakeover(t, env, 2, frozenAt)
	term := shortLease().Term
	t.Logf("the standby led %s after the leader froze (lease %s)", took.Round(time.Millisecond), term)
	if took < term-shortLease().CheckEvery {
		t.Errorf("the standby led %s after the leader froze, before the lease of %s ran out", took, term)
	}
	pgtest.Eventually(t, 60*time.Second, "the new leader ended the frozen leader's walsender and streams", func() (bool, string) {
		pid := pgtest.Scalar[int32](t, env.Source, `select coalesce(active_pid, 0) from pg_replication_slots where slot_name = $1`, env.Name)
		return pid != 0 && pid != oldWalsender, fmt.Sprintf("slot held by %d, the frozen leader's walsender was %d", pid, oldWalsender)
	})
	if err := leader.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, 30*time.Second, "the thawed leader waits as a standby", func() (bool, string) {
		l := leaderLocks(t, env)
		return l == "1 1", "leader locks held and waiting: " + l
	})
	finishUnderNewLeader(t, env, stopWorkload, out)
	if !strings.Contains(out.String(), "lost the leadership of the slot") {
		t.Errorf("the thawed leader did not log that it lost the leadership:\n%s", out)
	}
	if l := pgtest.Scalar[string](t, env.Target, `select epoch || ' ' || holder from pgconverge.leaders where slot = $1`, env.Name); !strings.HasSuffix(l, " "+lease.Holder()) {
		t.Errorf("leader row %q after the thaw, want one held by this process", l)
	}
}

// finishUnderNewLeader waits until the new leader streams live changes, stops the workload and
// requires equal tables, a caught-up slot, full coverage and no stream segment ended.
func finishUnderNewLeader(t *testing.T, env *pgtest.Env, stopWorkload func(), out *pgtest.SyncBuffer) {
	t.Helper()
	from := pgtest.Scalar[int64](t, env.Source, `select coalesce(max(txn), 0) from ledger`)
	pgtest.Eventually(t, 60*time.Second, "the new leader streams live changes", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select coalesce(max(txn), 0) from ledger`)
		return n > from+20, fmt.Sprintf("target at transaction %d, takeover at %d", n, from)
	})
	stopWorkload()
	requireWorkloadConverged(t, env)
	if t.Failed() {
		t.Logf("the first leader's output:\n%s", out)
	}
}

// A daemon whose settings differ from the leader's (here another --tables) refuses to wait as its
// standby, naming both settings: taking over, it would stop following the leader's tables.
func TestStandbyWithOtherSettingsRefuses(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `create table b (id int primary key)`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.a"}
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	// The same tables in another order, given otherwise, are the same settings.
	same := testConfig(t, env)
	same.Tables = []string{" public.a ,public.a"}
	standby := startDaemon(t, same)
	pgtest.Eventually(t, 30*time.Second, "a standby with the same tables waits", func() (bool, string) {
		l := leaderLocks(t, env)
		return l == "1 1", "leader and standby locks: " + l
	})
	standby.Stop(t)
	other := testConfig(t, env)
	other.Tables = []string{"public.a", "public.b"}
	requireRefusal(t, other, "is led by", "with other settings (publication "+env.Name+", tables public.a)",
		"(publication "+env.Name+", tables public.a,public.b)", "--tables")
}
