package engine_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
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
// empty and the source spilled nothing. A large transaction rolled back leaves nothing behind.
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

	writer := pgtest.Connect(t, env.SourceURL)
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, q := range []string{
		"insert into big select g, 'streamed ' || g, case when g % 500 = 0 then repeat(md5(g::text), 300) end from generate_series(1001, 6000) g",
		"savepoint s1",
		"insert into big select g, 'rolled back', null from generate_series(100001, 103000) g",
		"update big set v = 'rolled back too' where id between 1001 and 2000",
		"rollback to savepoint s1",
		"update big set v = 'updated in the transaction' where id % 10 = 0",
		"delete from big where id between 1 and 20",
		"insert into big select g, 'after the rollback', null from generate_series(6001, 9000) g",
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	pgtest.Eventually(t, time.Minute, "the open transaction staged on the target", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_staging where slot = $1`, env.Name)
		return n > 0, fmt.Sprintf("%d staged messages", n)
	})
	if st := streamingStatus(t, env); st.OpenTransactions != 1 || st.StagedMessages == 0 {
		t.Errorf("status while the transaction is open: %+v; want 1 open transaction with staged messages", st)
	}
	pgtest.Exec(t, env.Source, "insert into small values (1)")
	pgtest.WaitConverged(t, env, "small", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from big where id > 1000 or v <> 'loaded' or _cdc_deleted`); n != 0 {
		t.Fatalf("%d rows of the open transaction are visible on the target", n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitConverged(t, env, "big", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_staging where slot = $1`, env.Name); n != 0 {
		t.Errorf("%d messages left in the staging after the commit", n)
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
	// PostgreSQL 18 may skip a transaction it finds aborted before streaming it.
	if st := streamingStatus(t, env); st.SpillBytes != 0 || st.StreamTransactions < 1 || st.OpenTransactions != 0 {
		t.Errorf("status at the end: %+v; want nothing spilled, the committed transaction streamed, none open", st)
	}
}

// TestStreamedTransactionSurvivesKills kills the daemon (SIGKILL) while the source streams a large
// transaction before its commit (its changes half staged), and while its staged changes are read
// back and applied after its commit: the restarted daemon discards the earlier staging, the source
// streams the transaction again, and the target ends equal to the source, nothing lost or doubled.
func TestStreamedTransactionSurvivesKills(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		point string
		at    int
	}{{"mid-stream", 3}, {"mid-streamed-commit", 4000}} {
		t.Run(c.point, func(t *testing.T) {
			t.Parallel()
			env := pgtest.New(t)
			pgtest.RequireSourceVersion(t, env, 14, "streaming of in-progress transactions")
			ctx := context.Background()
			pgtest.Exec(t, env.Source, "create table big (id int primary key, v text)",
				"insert into big select g, 'loaded' from generate_series(1, 100) g")
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
			writer := pgtest.Connect(t, env.SourceURL)
			tx, err := writer.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			for _, q := range []string{
				"insert into big select g, 'streamed ' || g from generate_series(1001, 9000) g",
				"update big set v = 'updated' where id % 7 = 0",
				"delete from big where id % 11 = 0",
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
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
			cfg := testConfig(t, env)
			cfg.Source = source
			startDaemon(t, cfg)
			pgtest.WaitConverged(t, env, "big", "id")
			pgtest.Eventually(t, 30*time.Second, "the staging emptied", func() (bool, string) {
				n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_staging where slot = $1`, env.Name)
				return n == 0, fmt.Sprintf("%d staged messages", n)
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

	begin := func() pgx.Tx {
		tx, err := pgtest.Connect(t, env.SourceURL).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback(ctx) })
		return tx
	}
	exec := func(tx pgx.Tx, qs ...string) {
		t.Helper()
		for _, q := range qs {
			if _, err := tx.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	txA, txB := begin(), begin()
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
