package apply_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// raiseAsync runs Lead for slot s1 as holder on conn in a goroutine and returns where its epoch
// (or 0 on an error) arrives.
func raiseAsync(t *testing.T, conn *pgx.Conn, holder string) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		e, err := apply.Lead(context.Background(), conn, "s1", holder, "")
		if err != nil {
			t.Error(err)
		}
		out <- e
	}()
	return out
}

// waitBlocked waits until conn's session waits for another's lock and returns the sessions it
// waits for.
func waitBlocked(t *testing.T, watch, conn *pgx.Conn, raised <-chan int64) []int32 {
	t.Helper()
	var blockers []int32
	pgtest.Eventually(t, 30*time.Second, "the raise waits for the session that holds the epoch", func() (bool, string) {
		select {
		case e := <-raised:
			t.Fatalf("the raise did not wait: it returned epoch %d", e)
		default:
		}
		blockers = pgtest.Scalar[[]int32](t, watch, `select pg_blocking_pids($1)`, conn.PgConn().PID())
		return len(blockers) > 0, fmt.Sprintf("waits for %v", blockers)
	})
	return blockers
}

// A session that holds the epoch (HoldEpoch) holds off a new leader's Lead across its statements
// and transactions; CheckUnchallenged sees the waiting raise; the raise passes once the hold is
// released, or once it ends the holder's session (as a raise past its lease does), after which
// the holder runs nothing; and a hold of an old epoch fails with a *FencedError.
func TestHeldEpochHoldsOffTheRaise(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	lock, hold, watch := pgtest.Connect(t, f.env.TargetURL), pgtest.Connect(t, f.env.TargetURL), pgtest.Connect(t, f.env.TargetURL)
	old, err := apply.Lead(ctx, lock, "s1", "old", "")
	if err != nil || old != 1 {
		t.Fatalf("Lead = %d, %v; want epoch 1", old, err)
	}
	release, err := apply.HoldEpoch(ctx, hold, "s1", old)
	if err != nil {
		t.Fatalf("HoldEpoch of the current epoch: %v", err)
	}
	if err := apply.CheckUnchallenged(ctx, hold, "s1", old); err != nil {
		t.Fatalf("CheckUnchallenged before any raise: %v", err)
	}
	raised := raiseAsync(t, lock, "new")
	if b := waitBlocked(t, watch, lock, raised); len(b) != 1 || b[0] != int32(hold.PgConn().PID()) {
		t.Fatalf("the raise waits for %v, want the holder %d", b, hold.PgConn().PID())
	}
	var fenced *apply.FencedError
	if err := apply.CheckUnchallenged(ctx, hold, "s1", old); !errors.As(err, &fenced) || fenced.Current != 0 {
		t.Fatalf("CheckUnchallenged with a raise waiting: %v; want a *FencedError", err)
	}
	// Work in transactions of their own goes on while the raise waits.
	pgtest.Exec(t, hold, `create table held_a (id int)`, `create table held_b (id int)`)
	release()
	if e := <-raised; e != 2 {
		t.Fatalf("epoch raised after the release: %d, want 2", e)
	}
	if _, err := apply.HoldEpoch(ctx, hold, "s1", old); !errors.As(err, &fenced) || fenced.Current != 2 || fenced.Holder != "new" {
		t.Fatalf("HoldEpoch of epoch 1 after the raise: %v; want a *FencedError naming epoch 2 and holder new", err)
	}

	// A raise that ends the holder's session passes, and the holder runs nothing after it.
	if _, err := apply.HoldEpoch(ctx, hold, "s1", 2); err != nil {
		t.Fatalf("HoldEpoch of epoch 2: %v", err)
	}
	raised = raiseAsync(t, lock, "newer")
	waitBlocked(t, watch, lock, raised)
	ended := pgtest.Scalar[[]int32](t, watch, `select array_agg(b) from unnest(pg_blocking_pids($1)) b where pg_terminate_backend(b)`, lock.PgConn().PID())
	if len(ended) != 1 || ended[0] != int32(hold.PgConn().PID()) {
		t.Fatalf("ended %v, want the holder %d", ended, hold.PgConn().PID())
	}
	if e := <-raised; e != 3 {
		t.Fatalf("epoch raised past the ended holder: %d, want 3", e)
	}
	if _, err := hold.Exec(ctx, `create table held_c (id int)`); err == nil {
		t.Fatal("the ended holder's statement after the raise ran")
	}
	if n := pgtest.Scalar[int64](t, watch, `select count(*) from pg_class where relname = 'held_c'`); n != 0 {
		t.Errorf("held_c exists: the ended holder changed the target after the raise")
	}
}
