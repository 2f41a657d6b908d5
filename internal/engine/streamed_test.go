package engine_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// smallDecodingMemory returns the source URL with logical_decoding_work_mem at its minimum (64 kB)
// for the sessions it opens, the walsender among them: a transaction past it is streamed before
// its commit (or, without streaming, spilled to the source's disk).
func smallDecodingMemory(t *testing.T, sourceURL string) string {
	t.Helper()
	u, err := url.Parse(sourceURL)
	if err != nil {
		t.Fatal(err)
	}
	// %20, not the + of url.Values.Encode, which libpq's URL syntax does not read as a space.
	opt := "options=" + strings.ReplaceAll(url.QueryEscape("-c logical_decoding_work_mem=64kB"), "+", "%20")
	if u.RawQuery != "" {
		opt = "&" + opt
	}
	u.RawQuery += opt
	return u.String()
}

// TestStreamedTransactionIsAppliedAtItsCommit has the source stream a large transaction before its
// commit (PostgreSQL 14 and later): its changes are staged on the target, none visible there while
// it runs, while a small transaction committed meanwhile is applied at once; a rolled-back
// subtransaction's changes are discarded; at its commit everything else appears, the staging is
// empty and the source spilled nothing. A large transaction rolled back leaves nothing behind; one
// of INSERTs only of keys the target holds as tombstones is merged.
func TestStreamedTransactionIsAppliedAtItsCommit(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 14, "streaming of in-progress transactions")
	ctx := context.Background()
	pgtest.Exec(t, env.Source,
		"create table big (id int primary key, v text, doc text)",
		"create table small (id int primary key)",
		"insert into big select g, 'loaded', null from generate_series(1, 100) g")
	cfg := testConfig(t, env)
	cfg.Source = smallDecodingMemory(t, env.SourceURL)
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "big", "id")

	tx := openTransaction(t, env,
		"insert into big select g, 'streamed ' || g, case when g % 500 = 0 then repeat(md5(g::text), 300) end from generate_series(1001, 6000) g",
		"savepoint s1",
		"insert into big select g, 'rolled back', null from generate_series(100001, 103000) g",
		"update big set v = 'rolled back too' where id between 1001 and 2000",
		"rollback to savepoint s1",
		"update big set v = 'updated in the transaction' where id % 10 = 0",
		"delete from big where id between 1 and 20",
		"insert into big select g, 'after the rollback', null from generate_series(6001, 9000) g",
	)
	pgtest.Eventually(t, time.Minute, "the open transaction staged on the target", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_staging where slot = $1`, env.Name)
		return n > 0, fmt.Sprintf("%d staged messages", n)
	})
	if st := streamingStatus(t, env); st.OpenTransactions != 1 || st.StagedMessages == 0 {
		t.Errorf("status while the transaction is open: %+v; want 1 open transaction with staged messages", st)
	}
	// Its rows are staged ahead of the commit (inserts, updates and deletes of a keyed table), and
	// status shows them.
	pgtest.Eventually(t, 30*time.Second, "the open transaction's rows staged", func() (bool, string) {
		st := streamingStatus(t, env)
		return rowStagingTables(t, env) == 1 && st.StagedRowTables == 1 && st.StagedRowBytes > 0, fmt.Sprintf("status %+v", st)
	})
	pgtest.Exec(t, env.Source, "insert into small values (1)")
	pgtest.WaitConverged(t, env, "small", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from big where id > 1000 or v <> 'loaded' or _cdc_deleted`); n != 0 {
		t.Fatalf("%d rows of the open transaction are visible on the target", n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitConverged(t, env, "big", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_staging where slot = $1`, env.Name); n != 0 || rowStagingTables(t, env) != 0 {
		t.Errorf("%d messages and %d row staging tables left after the commit", n, rowStagingTables(t, env))
	}

	// A large transaction rolled back: nothing applied, nothing left staged.
	pgtest.Exec(t, env.Source, "begin", "insert into big select g, 'never', null from generate_series(200001, 206000) g", "rollback",
		"insert into small values (2)")
	pgtest.WaitConverged(t, env, "small", "id")
	pgtest.WaitConverged(t, env, "big", "id")
	pgtest.Eventually(t, 30*time.Second, "the rolled-back transaction's staging discarded", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_staging where slot = $1`, env.Name)
		return n == 0, fmt.Sprintf("%d staged messages", n)
	})
	// A large transaction of INSERTs only, two of whose keys the target holds as tombstones (deleted
	// above): its plain INSERT meets them, and the guarded merge takes over.
	pgtest.Exec(t, env.Source, "insert into big select g, 'again', null from (select 1 as g union all select 2 union all select g from generate_series(300001, 306000) g) k")
	pgtest.WaitConverged(t, env, "big", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from big where v = 'again' and not _cdc_deleted`); n != 6002 {
		t.Errorf("%d rows of the insert-only transaction live on the target, want 6002", n)
	}
	// PostgreSQL 18 may skip a transaction it finds aborted before streaming it.
	if st := streamingStatus(t, env); st.SpillBytes != 0 || st.StreamTransactions < 1 || st.OpenTransactions != 0 {
		t.Errorf("status at the end: %+v; want nothing spilled, the committed transaction streamed, none open", st)
	}
}

// TestStreamedTransactionSurvivesKills kills the daemon (SIGKILL) while the source streams a large
// transaction before its commit (its changes half staged), while its staged rows are merged at its
// commit (the target transaction not committed), and, for a transaction that takes the general
// path (a TRUNCATE), while its staged messages are read back and applied after its commit: the
// restarted daemon discards the earlier staging, the source streams the transaction again, and the
// target ends equal to the source, nothing lost or doubled.
func TestStreamedTransactionSurvivesKills(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		point string
		at    int
		// general has the transaction truncate a table first, so it takes the general path.
		general bool
	}{{"mid-stream", 3, false}, {"streamed-merge", 1, false}, {"mid-streamed-commit", 4000, true}} {
		t.Run(c.point, func(t *testing.T) {
			t.Parallel()
			env := pgtest.New(t)
			pgtest.RequireSourceVersion(t, env, 14, "streaming of in-progress transactions")
			ctx := context.Background()
			pgtest.Exec(t, env.Source, "create table big (id int primary key, v text)", "create table aside (id int primary key)",
				"insert into big select g, 'loaded' from generate_series(1, 100) g", "insert into aside values (1)")
			source := smallDecodingMemory(t, env.SourceURL)
			child := crashChildCmd(env, c.point, c.at)
			child.Env = append(child.Env, envCrashSrc+"="+source)
			var out pgtest.SyncBuffer
			child.Stdout, child.Stderr = &out, &out
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- child.Wait() }()
			pgtest.WaitConverged(t, env, "big", "id")
			stmts := []string{
				"insert into big select g, 'streamed ' || g from generate_series(1001, 9000) g",
				"update big set v = 'updated' where id % 7 = 0",
				"delete from big where id % 11 = 0",
			}
			if c.general {
				stmts = append([]string{"truncate aside"}, stmts...)
			}
			tx := openTransaction(t, env, stmts...)
			if c.point == "mid-stream" {
				requireKilled(t, <-exited, []byte(out.String()))
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if c.point != "mid-stream" {
				requireKilled(t, <-exited, []byte(out.String()))
			}
			// Killed with the transaction staged, before or while it was read back.
			if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_staging where slot = $1`, env.Name); n == 0 {
				t.Fatalf("nothing staged when the daemon was killed at %s", c.point)
			}
			// Rows were staged ahead of the commit unless the transaction took the general path.
			if n := rowStagingTables(t, env); (n > 0) == c.general {
				t.Fatalf("%d row staging tables when the daemon was killed at %s (general path: %v)", n, c.point, c.general)
			}
			cfg := testConfig(t, env)
			cfg.Source = source
			startDaemon(t, cfg)
			pgtest.WaitConverged(t, env, "big", "id")
			pgtest.WaitConverged(t, env, "aside", "id")
			pgtest.Eventually(t, 30*time.Second, "the staging emptied", func() (bool, string) {
				n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_staging where slot = $1`, env.Name)
				return n == 0 && rowStagingTables(t, env) == 0, fmt.Sprintf("%d staged messages, %d row staging tables", n, rowStagingTables(t, env))
			})
		})
	}
}

// TestInterleavedStreamedTransactions has the source stream two large transactions in interleaved
// blocks while small ones commit between them; one adds a column and fills it, the other
// truncates a table and loads it again and rolls a subtransaction back. Each is applied at its
// commit, in commit order, and the target converges.
func TestInterleavedStreamedTransactions(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 14, "streaming of in-progress transactions")
	ctx := context.Background()
	pgtest.Exec(t, env.Source,
		"create table a (id int primary key, v text)",
		"create table b (id int primary key, v text)",
		"create table small (id int primary key)",
		"insert into a select g, 'loaded' from generate_series(1, 100) g",
		"insert into b select g, 'loaded' from generate_series(1, 100) g")
	cfg := testConfig(t, env)
	cfg.Source = smallDecodingMemory(t, env.SourceURL)
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "b", "id")

	exec := func(tx pgx.Tx, qs ...string) {
		t.Helper()
		for _, q := range qs {
			if _, err := tx.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	txA, txB := openTransaction(t, env), openTransaction(t, env)
	small := 0
	commitSmall := func() {
		small++
		pgtest.Exec(t, env.Source, fmt.Sprintf("insert into small values (%d)", small))
	}
	for round := 0; round < 3; round++ {
		exec(txA, fmt.Sprintf("insert into a select g, 'a round %d' from generate_series(%d, %d) g", round, 1000+round*2000, 2999+round*2000))
		commitSmall()
		exec(txB, fmt.Sprintf("insert into b select g, 'b round %d' from generate_series(%d, %d) g", round, 1000+round*2000, 2999+round*2000))
		commitSmall()
	}
	exec(txA, "alter table a add column w int", "update a set w = id * 2 where id % 3 = 0",
		"insert into a select g, 'after the column', g from generate_series(20001, 22000) g")
	exec(txB, "savepoint s", "delete from b where id < 5000", "rollback to savepoint s",
		"truncate b", "insert into b select g, 'after the truncate' from generate_series(1, 3000) g")
	pgtest.WaitConverged(t, env, "small", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select (select count(*) from a where id > 100) + (select count(*) from b where id > 100)`); n != 0 {
		t.Fatalf("%d rows of the open transactions are visible on the target", n)
	}
	if err := txB.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	commitSmall()
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	commitSmall()
	pgtest.WaitConverged(t, env, "small", "id")
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.WaitConverged(t, env, "a", "id")
}

// streamingStatus returns pgconverge status's streaming view of the test's slot.
func streamingStatus(t *testing.T, env *pgtest.Env) operator.StreamingStatus {
	t.Helper()
	rep, err := operator.Status(t.Context(), operator.StatusConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: env.Name})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Slots {
		if s.Name == env.Name && s.Streaming != nil {
			return *s.Streaming
		}
	}
	t.Fatalf("status has no streaming view of slot %s: %+v", env.Name, rep.Slots)
	return operator.StreamingStatus{}
}

// rowStagingTables returns how many row staging tables of streamed transactions the target holds.
func rowStagingTables(t *testing.T, env *pgtest.Env) int64 {
	t.Helper()
	return pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace
where n.nspname = 'pgconverge' and starts_with(c.relname, 'stream_rows_')`)
}

// TestStreamedTransactionRacesABackfill has a backfill of a table race a large transaction the
// source streams before its commit: the backfill starts while the transaction is open (its
// temporary slot waits for the transaction to end, so its snapshot has it), and writes while the
// merge of the transaction's staged rows holds its target transaction open, waiting for its locks.
// The target ends equal to the source.
func TestStreamedTransactionRacesABackfill(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 14, "streaming of in-progress transactions")
	ctx := context.Background()
	pgtest.Exec(t, env.Source, "create table big (id int primary key, v text)",
		"insert into big select g, 'loaded' from generate_series(1, 20000) g")
	cfg := testConfig(t, env)
	cfg.Source = smallDecodingMemory(t, env.SourceURL)
	merging, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cfg.Knobs.BeforeStreamedCommit = func() {
		once.Do(func() {
			close(merging)
			<-release
		})
	}
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "big", "id")

	tx := openTransaction(t, env,
		"update big set v = 'streamed' where id % 3 = 0",
		"delete from big where id % 5 = 0",
		"insert into big select g, 'inserted' from generate_series(20001, 30000) g",
	)
	pgtest.Eventually(t, time.Minute, "the open transaction's rows staged", func() (bool, string) {
		n := rowStagingTables(t, env)
		return n == 1, fmt.Sprintf("%d row staging tables", n)
	})
	done := make(chan error, 1)
	bcfg := testBackfillConfig(t, env, "public.big")
	go func() {
		_, err := operator.Backfill(ctx, bcfg)
		done <- err
	}()
	pgtest.Eventually(t, time.Minute, "the backfill's slot waits for the open transaction", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where slot_name like 'pgconverge_snap_%'`)
		return n > 0, fmt.Sprintf("%d temporary slots", n)
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-merging:
	case <-time.After(time.Minute):
		t.Fatal("the streamed transaction's rows were not merged within a minute of its commit")
	}
	pgtest.Eventually(t, time.Minute, "the backfill waits for the merge's locks", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`)
		return n > 0, fmt.Sprintf("%d sessions wait for a lock", n)
	})
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("backfill: %v", err)
	}
	pgtest.WaitConverged(t, env, "big", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from big where not _cdc_deleted`); n != 26000 {
		t.Errorf("%d live rows on the target, want 26000", n)
	}
}

// TestStreamedTransactionTakesTheGeneralPathPartWay has the source stream a large transaction
// whose first changes are staged as rows and whose later ones only the general path handles: an
// UPDATE that leaves a TOASTed value, which the transaction itself inserted, out as unchanged, then
// a TRUNCATE. At the commit the rows are merged first, and the messages after them are applied on
// top: the target ends equal to the source, every value known.
func TestStreamedTransactionTakesTheGeneralPathPartWay(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 14, "streaming of in-progress transactions")
	ctx := context.Background()
	pgtest.Exec(t, env.Source, "create table docs (id int primary key, v text, doc text)", "create table aside (id int primary key)",
		"alter table docs alter column doc set storage external", "insert into aside values (1)")
	cfg := testConfig(t, env)
	cfg.Source = smallDecodingMemory(t, env.SourceURL)
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "aside", "id")

	tx := openTransaction(t, env,
		"insert into docs select g, 'inserted', repeat(md5(g::text), 100) from generate_series(1, 3000) g",
		"update docs set v = 'touched' where id % 2 = 0", // doc is sent as unchanged TOAST
		"truncate aside",
		"insert into aside select g from generate_series(10, 20) g",
		"insert into docs select g, 'after', repeat(md5(g::text), 100) from generate_series(3001, 4000) g",
	)
	pgtest.Eventually(t, time.Minute, "the first changes staged as rows, the rest as messages", func() (bool, string) {
		n := rowStagingTables(t, env)
		m := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_staging where slot = $1 and kind = 'U'`, env.Name)
		return n == 1 && m > 0, fmt.Sprintf("%d row staging tables, %d UPDATE messages staged", n, m)
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitConverged(t, env, "docs", "id")
	pgtest.WaitConverged(t, env, "aside", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from docs where _cdc_unknown is not null or doc is null`); n != 0 {
		t.Errorf("%d target rows of docs lack their TOASTed value", n)
	}
	pgtest.Eventually(t, 30*time.Second, "the staging emptied", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_staging where slot = $1`, env.Name)
		return n == 0 && rowStagingTables(t, env) == 0, fmt.Sprintf("%d staged messages, %d row staging tables", n, rowStagingTables(t, env))
	})
}

// openTransaction begins a transaction on a new connection to the source, runs stmts in it and
// returns it open; it is rolled back at the test's end unless committed before.
func openTransaction(t *testing.T, env *pgtest.Env, stmts ...string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pgtest.Connect(t, env.SourceURL).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	for _, q := range stmts {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return tx
}
