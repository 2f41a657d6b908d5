package apply_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// The leader lock admits one session per slot; a new leader's Lead waits for the old leader's
// transaction that checked the epoch, and from then on the old leader's transactions fail with a
// *FencedError and write nothing, progress included.
func TestLeaderEpochFencesTheOldLeader(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	oldLock, newLock := pgtest.Connect(t, f.env.TargetURL), pgtest.Connect(t, f.env.TargetURL)
	if ok, err := apply.LockLeader(ctx, oldLock, "s1", false); !ok || err != nil {
		t.Fatalf("first LockLeader = %v, %v; want the lock", ok, err)
	}
	if ok, err := apply.LockLeader(ctx, newLock, "s1", false); ok || err != nil {
		t.Fatalf("second LockLeader while the first holds it = %v, %v; want no lock", ok, err)
	}
	if ok, err := apply.LockLeader(ctx, newLock, "s2", false); !ok || err != nil {
		t.Fatalf("LockLeader of another slot = %v, %v; want the lock", ok, err)
	}
	oldEpoch, err := apply.Lead(ctx, oldLock, "s1", "old", "")
	if err != nil || oldEpoch != 1 {
		t.Fatalf("Lead = %d, %v; want epoch 1", oldEpoch, err)
	}
	group := func(tx *apply.Tx, lsn uint64, id string, epoch int64) error {
		_, err := tx.ApplyGroup(ctx, []arrow.RecordBatch{batch(t, row{changebatch.OpUpsert, lsn, 1, id, s("x"), "1"})},
			apply.Progress{Slot: "s1", LSN: 300, Epoch: epoch})
		return err
	}
	// The old leader's transaction holds the leader row while a new leader takes over.
	tx, err := f.ap.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := group(tx, 100, "1", oldEpoch); err != nil {
		t.Fatalf("the leader's group: %v", err)
	}
	// The old leader's lock connection ends: the new leader gets the lock and raises the epoch,
	// which waits for the old leader's transaction.
	if err := oldLock.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := apply.LockLeader(ctx, newLock, "s1", true); !ok || err != nil {
		t.Fatalf("LockLeader after the holder's session ended = %v, %v", ok, err)
	}
	newEpoch := make(chan int64, 1)
	go func() {
		e, err := apply.Lead(ctx, newLock, "s1", "new", "")
		if err != nil {
			t.Error(err)
		}
		newEpoch <- e
	}()
	watch := pgtest.Connect(t, f.env.TargetURL)
	pgtest.Eventually(t, 30*time.Second, "the new leader's Lead waits for the old leader's transaction", func() (bool, string) {
		n := pgtest.Scalar[int64](t, watch, `select count(*) from pg_locks l join pg_stat_activity a on a.pid = l.pid
where not l.granted and a.datname = current_database() and a.query like '%pgconverge.leaders%'`)
		return n == 1, fmt.Sprintf("%d waiting", n)
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit of the transaction that checked the epoch before the new leader: %v", err)
	}
	if e := <-newEpoch; e != 2 {
		t.Fatalf("new epoch = %d, want 2", e)
	}
	// Every later transaction of the old leader is refused before it writes.
	tx2, err := f.ap.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	err = group(tx2, 200, "2", oldEpoch)
	var fenced *apply.FencedError
	if !errors.As(err, &fenced) || fenced.Current != 2 || fenced.Holder != "new" {
		t.Fatalf("old leader's group after the takeover: %v; want a *FencedError naming epoch 2 and holder new", err)
	}
	tx2.Rollback(ctx)
	f.expect(t, "1|x|1|0/64#1|f|")
	if l, ok, err := apply.ReadLeader(ctx, f.env.Target, "s1"); err != nil || !ok || l.Epoch != 2 || l.Holder != "new" {
		t.Errorf("ReadLeader = %+v, %v, %v; want epoch 2 held by new", l, ok, err)
	}
}

// Two slot names whose 32-bit hashtext collides ("orders_57540", "orders_143142") have leader locks
// of their own.
func TestLeaderLocksOfCollidingNamesAreApart(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a, b := pgtest.Connect(t, f.env.TargetURL), pgtest.Connect(t, f.env.TargetURL)
	if pgtest.Scalar[int32](t, a, `select hashtext('orders_57540')`) != pgtest.Scalar[int32](t, a, `select hashtext('orders_143142')`) {
		t.Fatal("the names no longer collide under hashtext: pick another pair")
	}
	for _, c := range []struct {
		conn *pgx.Conn
		slot string
	}{{a, "orders_57540"}, {b, "orders_143142"}} {
		if ok, err := apply.LockLeader(ctx, c.conn, c.slot, false); !ok || err != nil {
			t.Errorf("LockLeader(%s) = %v, %v; want the lock", c.slot, ok, err)
		}
		if pid, _, err := apply.LeaderLockHolder(ctx, f.env.Target, c.slot); err != nil || pid != int32(c.conn.PgConn().PID()) {
			t.Errorf("LeaderLockHolder(%s) = %d, %v; want %d", c.slot, pid, err, c.conn.PgConn().PID())
		}
	}
}
