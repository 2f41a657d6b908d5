package advisory_test

import (
	"time"

	"testing"

	"github.com/pgconverge/pgconverge/internal/advisory"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// The slot locks keep the keys they had before this package (apply's lockKey), so daemons of
// earlier versions and of this one exclude each other on them.
func TestSlotLockKeysAreUnchanged(t *testing.T) {
	for kind, lock := range map[string]advisory.Lock{
		"leader": advisory.Leader("$1"), "standby": advisory.Standby("$1"),
		"running": advisory.Running("$1"), "epoch": advisory.Epoch("$1"),
	} {
		want := `('x' || substr(md5('pgconverge ` + kind + ` ' || $1), 1, 16))::bit(64)::bigint`
		if got := lock.Key(); got != want {
			t.Errorf("%s key = %s, want %s", kind, got, want)
		}
	}
}

func TestLockSQL(t *testing.T) {
	l := advisory.DDL()
	const key = `('x' || substr(md5('pgconverge ddl ' || ''), 1, 16))::bit(64)::bigint`
	for _, c := range []struct{ got, want string }{
		{l.Lock(), "pg_advisory_lock(" + key + ")"},
		{l.TryLock(), "pg_try_advisory_lock(" + key + ")"},
		{l.Unlock(), "pg_advisory_unlock(" + key + ")"},
		{l.LockShared(), "pg_advisory_lock_shared(" + key + ")"},
		{l.UnlockShared(), "pg_advisory_unlock_shared(" + key + ")"},
		{l.XactLock(), "pg_advisory_xact_lock(" + key + ")"},
		{l.TryXactLock(), "pg_try_advisory_xact_lock(" + key + ")"},
		{l.Held(), "(((" + key + " >> 32) & 4294967295)::oid, (" + key + " & 4294967295)::oid) in (select classid, objid from pg_locks where locktype = 'advisory' and objsubid = 1 and granted and database = (select oid from pg_database where datname = current_database()))"},
		{l.Is("k"), "(k.locktype = 'advisory' and k.objsubid = 1 and k.classid = ((" + key + " >> 32) & 4294967295)::oid and k.objid = (" + key + " & 4294967295)::oid and k.database = (select oid from pg_database where datname = current_database()))"},
	} {
		if c.got != c.want {
			t.Errorf("got  %s\nwant %s", c.got, c.want)
		}
	}
}

// Every kind of lock has a key of its own for one name, and Held, Awaited and Is see a lock
// another session holds or waits for, in pg_locks, by its kind and name.
func TestLocksInPgLocks(t *testing.T) {
	env := pgtest.New(t)
	ctx := t.Context()
	locks := map[string]advisory.Lock{
		"leader": advisory.Leader("'s1'"), "standby": advisory.Standby("'s1'"), "running": advisory.Running("'s1'"),
		"epoch": advisory.Epoch("'s1'"), "run": advisory.Run("7"), "backfill": advisory.Backfill("'s1'"),
		"worker": advisory.Worker("7"), "follow": advisory.Follow(), "ddl": advisory.DDL(),
	}
	keys := map[int64]string{}
	for kind, l := range locks {
		k := pgtest.Scalar[int64](t, env.Target, "select "+l.Key())
		if other, dup := keys[k]; dup {
			t.Errorf("%s and %s share key %d", kind, other, k)
		}
		keys[k] = kind
	}
	holder, waiter := pgtest.Connect(t, env.TargetURL), pgtest.Connect(t, env.TargetURL)
	for kind, l := range locks {
		if pgtest.Scalar[bool](t, env.Target, "select "+l.Held()) {
			t.Fatalf("%s is held before anyone took it", kind)
		}
		pgtest.Exec(t, holder, "select "+l.Lock())
		if !pgtest.Scalar[bool](t, env.Target, "select "+l.Held()) {
			t.Errorf("%s: Held is false while a session holds it", kind)
		}
		if n := pgtest.Scalar[int64](t, env.Target, "select count(*) from pg_locks k where k.granted and "+l.Is("k")); n != 1 {
			t.Errorf("%s: Is matches %d granted rows, want 1", kind, n)
		}
		if pgtest.Scalar[bool](t, env.Target, "select "+l.TryLock()) {
			t.Errorf("%s: TryLock got a lock another session holds", kind)
		}
		if kind == "worker" {
			// The worker lock of a pid is its session's: Held of the holder's pid sees it.
			pid := pgtest.Scalar[int32](t, holder, "select pg_backend_pid()")
			pgtest.Exec(t, holder, "select "+advisory.Worker("pg_backend_pid()").Lock())
			if !pgtest.Scalar[bool](t, env.Target, "select "+advisory.Worker("$1::int").Held(), pid) {
				t.Errorf("the worker lock of pid %d is not held by its session", pid)
			}
		}
		pgtest.Exec(t, holder, "select pg_advisory_unlock_all()")
		if pgtest.Scalar[bool](t, env.Target, "select "+l.Held()) {
			t.Errorf("%s: Held is true after its holder released it", kind)
		}
	}
	// A waiter shows in Awaited until it gets the lock.
	l := locks["epoch"]
	pgtest.Exec(t, holder, "select "+l.LockShared())
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "select "+l.XactLock())
		done <- err
	}()
	pgtest.Eventually(t, 10*time.Second, "the exclusive taker waits for the shared holder", func() (bool, string) {
		return pgtest.Scalar[bool](t, env.Target, "select "+l.Awaited()), "not waiting"
	})
	pgtest.Exec(t, holder, "select "+l.UnlockShared())
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if pgtest.Scalar[bool](t, env.Target, "select "+l.Awaited()) {
		t.Error("Awaited is true after the waiter got the lock")
	}
}
