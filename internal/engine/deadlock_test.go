package engine_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/operator"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// waitRowLockWaiters polls until n target backends wait for a row lock (a transaction's or a
// tuple's) in url's database and returns the start of the query of each waiter, or an error
// after 30 s.
func waitRowLockWaiters(ctx context.Context, t *testing.T, url string, n int) ([]string, error) {
	mon := pgtest.Connect(t, url)
	defer mon.Close(ctx)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		rows, err := mon.Query(ctx, `select distinct on (l.pid) left(a.query, 60) from pg_locks l join pg_stat_activity a using (pid)
where not l.granted and l.locktype in ('transactionid', 'tuple') and a.datname = current_database() order by l.pid`)
		if err != nil {
			return nil, err
		}
		queries, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(queries) >= n {
			return queries, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d target backends wait for a row lock, want %d", len(queries), n)
		}
	}
}

// The interleaving that would deadlock the stream and a backfill's completion does not: the
// completion tombstones the rows its snapshot lacked in the table's physical order (3, then 1),
// the stream upserts in key order (1, 2, 3), but the completion first takes the table's fence row,
// which every stream transaction writing the table holds FOR SHARE from its start, so it waits
// for the stream transaction to end instead of taking row 3 under it. A target session holding
// row 2 stalls the stream transaction in the middle to line this up. No conflict is lost or
// retried; the stream's rows survive the completion; the tables converge.
func TestBackfillCompletionWaitsForTheStream(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	ctx := context.Background()
	pgtest.Exec(t, env.Source, `create table d (id int primary key, v text)`, `insert into d values (2, 'v')`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.WaitConverged(t, env, "d", "id")
	// Rows the source never had, stored after row 2 in the order 3, 1: the completion tombstones them.
	pgtest.Exec(t, env.Target, `insert into d (id, v, _cdc_lsn, _cdc_seq, _cdc_deleted) values (3, 'stray', '0/1', 0, false)`,
		`insert into d (id, v, _cdc_lsn, _cdc_seq, _cdc_deleted) values (1, 'stray', '0/1', 0, false)`)
	cfg := testBackfillConfig(t, env, "public.d")
	cfg.Workers = 1
	var once sync.Once
	var hookErr, releaseErr error
	var waiters []string
	released := make(chan struct{})
	cfg.AfterChunk = func(string, int64) { // the chunk (row 2) is in; the completion comes next
		once.Do(func() {
			holder := pgtest.Connect(t, env.TargetURL)
			tx, err := holder.Begin(ctx)
			if err == nil {
				_, err = tx.Exec(ctx, `select 1 from d where id = 2 for update`)
			}
			if err == nil {
				_, err = env.Source.Exec(ctx, `begin; insert into d values (1, 'w2'); update d set v = 'v2' where id = 2; insert into d values (3, 'x2'); commit`)
			}
			if err == nil {
				_, err = waitRowLockWaiters(ctx, t, env.TargetURL, 1) // the stream: holds row 1, waits for row 2
			}
			if hookErr = err; err != nil {
				close(released)
				return
			}
			go func() {
				defer close(released)
				// The completion waits for the stream's transaction as well.
				if waiters, releaseErr = waitRowLockWaiters(ctx, t, env.TargetURL, 2); releaseErr == nil {
					releaseErr = tx.Commit(ctx)
				}
			}()
		})
	}
	rep, err := operator.Backfill(ctx, cfg)
	<-released
	if hookErr != nil || releaseErr != nil {
		t.Fatalf("lining up the stream and the completion: %v %v", hookErr, releaseErr)
	}
	if err != nil {
		t.Fatalf("backfill: %v", err)
	}
	if !strings.Contains(strings.Join(waiters, "\n"), "update pgconverge.backfills") && !strings.Contains(strings.Join(waiters, "\n"), "with c as") {
		t.Errorf("waiters %q: want the completion's first statement among them", waiters)
	}
	if rep.Conflicts != 0 || rep.Tombstoned != 0 {
		t.Errorf("conflicts %d, tombstoned %d: want 0 and 0 (the completion ran after the stream wrote rows 1 and 3)", rep.Conflicts, rep.Tombstoned)
	}
	pgtest.WaitConverged(t, env, "d", "id")
	d.RequireRunning(t)
}

// A backfill chunk that loses a deadlock is retried: a target session holds row 5, the chunk's
// merge takes rows 1 to 4 in key order and waits for row 5, and the session then asks for row 2.
// PostgreSQL ends the chunk's transaction, which waited first, with 40P01 (the session waits 10 s
// before it checks); the chunk is read again after a backoff, counted, and the tables converge.
func TestLostDeadlockOfABackfillChunkIsRetried(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	ctx := context.Background()
	pgtest.Exec(t, env.Source, `create table d (id int primary key, v text)`, `insert into d select g, 'v' || g from generate_series(1, 10) g`)
	backfillNow(t, testBackfillConfig(t, env, "public.d"))
	pgtest.Exec(t, env.Source, `update d set v = v || ', again'`)
	holder := pgtest.Connect(t, env.TargetURL)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	pgtest.Exec(t, tx.Conn(), `set local deadlock_timeout = '10s'`, `select 1 from d where id = 5 for update`)
	cfg := testBackfillConfig(t, env, "public.d")
	cfg.Workers = 1
	var logs pgtest.SyncBuffer
	cfg.Logger = newTestLogger(t, &logs)
	wait, _ := backfillInBackground(t, cfg)
	if _, err := waitRowLockWaiters(ctx, t, env.TargetURL, 1); err != nil {
		t.Fatal(err)
	}
	// Returns once PostgreSQL ended the chunk's transaction.
	pgtest.Exec(t, tx.Conn(), `select 1 from d where id = 2 for update`)
	tx.Rollback(ctx)
	rep, err := wait()
	if err != nil {
		t.Fatalf("backfill: %v", err)
	}
	if rep.Conflicts != 1 {
		t.Errorf("conflicts lost and retried: %d, want 1", rep.Conflicts)
	}
	if l := logs.String(); !strings.Contains(l, "deadlock detected") || !strings.Contains(l, "retrying") {
		t.Errorf("no WARN of the chunk's lost deadlock in the log")
	}
	pgtest.WaitConverged(t, env, "d", "id")
}
