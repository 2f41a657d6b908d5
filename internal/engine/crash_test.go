package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/schedule"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// Crash tests run the daemon in a child process (this test binary, re-executed) whose Knobs kill
// it with SIGKILL at a chosen boundary, then restart the daemon and check that no row was lost or
// doubled. The child reads its instructions from these environment variables; only TestMain reads
// them, the daemon itself only sees Knobs.
const (
	envCrashPoint = "PGCONVERGE_CRASH_POINT"
	envCrashAt    = "PGCONVERGE_CRASH_AT"
	envCrashSrc   = "PGCONVERGE_CRASH_SOURCE"
	envCrashTgt   = "PGCONVERGE_CRASH_TARGET"
	envCrashSlot  = "PGCONVERGE_CRASH_SLOT"
	// envCrashPrimary, when set, is the child daemon's Config.Primary (its source is a standby).
	envCrashPrimary = "PGCONVERGE_CRASH_PRIMARY"
	// envCrashChunkRows, when set, is the chunk size of the backfill child (backfillCrashChild).
	envCrashChunkRows = "PGCONVERGE_CRASH_CHUNK_ROWS"
	// envShortLease, set to 1, gives a child the tests' short lease (shortLease), as its parent
	// test gives its own daemons and runs: every process of a test runs on the same lease.
	envShortLease = "PGCONVERGE_TEST_SHORT_LEASE"
)

// shortLease is the lease of the tests that wait for it to run out (a frozen process is ended, a
// standby takes over from a frozen leader): a 6 s term instead of 15 s, checked every second. The
// term stays several checks long, so a heartbeat late on a machine busy with parallel tests does
// not lose a live process its sessions.
func shortLease() lease.Timings {
	return lease.Timings{CheckEvery: time.Second, CheckTimeout: 3 * time.Second, Term: 6 * time.Second}
}

// childLease returns shortLease in a child started with envShortLease=1, else no timings (the
// production lease).
func childLease() lease.Timings {
	if os.Getenv(envShortLease) == "1" {
		return shortLease()
	}
	return lease.Timings{}
}

func TestMain(m *testing.M) {
	if os.Getenv(envVerifyKill) != "" {
		os.Exit(verifyRepairChild())
	}
	if os.Getenv(envSoakJoin) != "" {
		os.Exit(soakJoinChild())
	}
	if point := os.Getenv(envCrashPoint); strings.HasPrefix(point, "cutover:") {
		os.Exit(cutoverCrashChild(strings.TrimPrefix(point, "cutover:")))
	} else if point == "backfill-chunk" || point == "backfill-batch" {
		at, _ := strconv.Atoi(os.Getenv(envCrashAt))
		os.Exit(backfillCrashChild(point, at))
	} else if point != "" {
		os.Exit(crashChild(point))
	}
	os.Exit(m.Run())
}

func kill() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }

// crashKnobs returns knobs that SIGKILL this process at the at-th occurrence of point.
func crashKnobs(point string, at int) (Knobs, error) {
	var k Knobs
	var mu sync.Mutex
	count := 0
	hit := func() {
		mu.Lock()
		defer mu.Unlock()
		if count++; count == at {
			kill()
		}
	}
	switch point {
	case "after-begin": // Begin received, nothing of the transaction applied
		k.Stream.OnMessage = func(m pglogrepl.Message) {
			if _, ok := m.(*pglogrepl.BeginMessage); ok {
				hit()
			}
		}
	case "mid-transaction": // the third change of a transaction received
		changes := 0
		k.Stream.OnMessage = func(m pglogrepl.Message) {
			switch m.(type) {
			case *pglogrepl.BeginMessage:
				changes = 0
			case *pglogrepl.InsertMessage, *pglogrepl.UpdateMessage, *pglogrepl.DeleteMessage:
				if changes++; changes == 3 {
					hit()
				}
			}
		}
	case "mid-stream": // messages of a transaction streamed before its commit staged
		k.Stream.AfterStage = hit
	case "streamed-merge": // a streamed transaction's staged rows merged, the target not committed
		k.BeforeStreamedCommit = hit
	case "mid-streamed-commit": // a streamed transaction read back after its commit, in part
		k.Stream.OnMessage = func(m pglogrepl.Message) {
			if _, ok := m.(*pglogrepl.InsertMessage); ok {
				hit()
			}
		}
	case "after-commit": // the target committed a group, the source was not told
		k.Stream.AfterApply = func(pglogrepl.LSN) { hit() }
	case "during-load": // a chunk of the initial load committed
		k.AfterLoadChunk = func(string, int64) { hit() }
	case "during-gap-repair": // a gap repair's write transaction committed, the next not begun
		k.BeforeGapRepairBatch = func(_ string, written int64) {
			if written > 0 {
				hit()
			}
		}
	case "none": // the parent kills the child at a moment of its choosing
	default:
		return k, fmt.Errorf("unknown crash point %q", point)
	}
	return k, nil
}

// crashChild runs the daemon until it is killed; reaching the end is a failure (exit 3).
func crashChild(point string) int {
	at, _ := strconv.Atoi(os.Getenv(envCrashAt))
	knobs, err := crashKnobs(point, at)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg := Config{
		Source: os.Getenv(envCrashSrc), Target: os.Getenv(envCrashTgt),
		Primary: os.Getenv(envCrashPrimary),
		Slot:    os.Getenv(envCrashSlot), Publication: os.Getenv(envCrashSlot), BackfillWorkers: 2, ChunkRows: 1000,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)), Knobs: knobs, StreamInProgress: true,
	}
	cfg.Knobs.Lease = childLease()
	if point == "during-gap-repair" {
		cfg.OnGap = OnGapRepair
	}
	limit := 60 * time.Second
	if point == "none" {
		// The parent kills it (an HA pair's leader, the random kills); the limit only ends an
		// orphan. A test of a frozen leader outlasts a minute on a machine busy with parallel tests.
		limit = 10 * time.Minute
	}
	if os.Getenv(envSoakChild) != "" {
		// The soak's daemon: scheduled backfills and verifies with repair, until it is killed.
		limit = 24 * time.Hour
		cfg.BackfillSchedule, _ = schedule.Parse("@every 7s")
		cfg.VerifySchedule, _ = schedule.Parse("@every 11s")
		cfg.VerifyRepair = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	err = Run(ctx, cfg)
	fmt.Fprintf(os.Stderr, "crash child reached the end without crashing at %s #%d: %v\n", point, at, err)
	return 3
}

// workload runs transactions of several changes on the source until the returned stop function is
// called: two balance updates, five ledger inserts and one ledger delete each.
func workload(t *testing.T, env *pgtest.Env) (stop func()) {
	return sourceLoop(t, env, workloadTxn)
}

// workloadTxn is the workload's transaction i, in tx.
func workloadTxn(ctx context.Context, tx pgx.Tx, i int) error {
	for _, st := range []struct {
		sql  string
		args []any
	}{
		{`update acct set bal = bal + 1 where id = $1`, []any{i*7%2000 + 1}},
		{`update acct set bal = bal - 1 where id = $1`, []any{i*13%2000 + 1}},
		{`insert into ledger (txn, k) select $1, g from generate_series(1, 5) g`, []any{i}},
		{`delete from ledger where id = (select min(id) from ledger where k = 3)`, nil},
	} {
		if _, err := tx.Exec(ctx, st.sql, st.args...); err != nil {
			return err
		}
	}
	return nil
}

// sourceLoop runs txn in a source transaction of its own for i = 1, 2, … until the returned stop
// function is called (at the test's cleanup at the latest); an error fails the test and ends the
// loop.
func sourceLoop(t *testing.T, env *pgtest.Env, txn func(ctx context.Context, tx pgx.Tx, i int) error) (stop func()) {
	conn := pgtest.Connect(t, env.SourceURL)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx := context.Background()
		for i := 1; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return txn(ctx, tx, i) }); err != nil {
				t.Errorf("workload transaction %d: %v", i, err)
				return
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// setupCrashTables creates the tables the workload writes to, with rows for the initial load.
func setupCrashTables(t *testing.T, env *pgtest.Env) {
	pgtest.Exec(t, env.Source,
		`create table acct (id int primary key, bal int not null)`,
		`insert into acct select g, 0 from generate_series(1, 2000) g`,
		`create table ledger (id bigserial primary key, txn int, k int)`,
		`insert into ledger (txn, k) select 0, g % 5 from generate_series(1, 8000) g`)
}

// crashChildCmd returns the command that runs the daemon in a child process killed at point.
func crashChildCmd(env *pgtest.Env, point string, at int) *exec.Cmd {
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), envCrashPoint+"="+point, envCrashAt+"="+strconv.Itoa(at),
		envCrashSrc+"="+env.SourceURL, envCrashTgt+"="+env.TargetURL, envCrashSlot+"="+env.Name)
	return child
}

// requireKilled fails the test unless err says the child died of SIGKILL.
func requireKilled(t *testing.T, err error, out []byte) {
	t.Helper()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child was not killed by SIGKILL: %v\n%s", err, out)
	}
}

// finishAfterRestart restarts the daemon in the test process while the workload goes on, waits
// until it streams live changes, stops the workload and requires both tables equal and the slot
// caught up.
func finishAfterRestart(t *testing.T, env *pgtest.Env, stopWorkload func()) {
	restartedAt := pgtest.Scalar[int64](t, env.Source, `select coalesce(max(txn), 0) from ledger`)
	startDaemon(t, testConfig(t, env))
	pgtest.Eventually(t, 60*time.Second, "restarted daemon streams live changes", func() (bool, string) {
		var n int64
		err := env.Target.QueryRow(context.Background(), `select coalesce(max(txn), 0) from ledger`).Scan(&n)
		return err == nil && n > restartedAt+20, fmt.Sprintf("target at transaction %d, restarted at %d (%v)", n, restartedAt, err)
	})
	stopWorkload()
	requireWorkloadConverged(t, env)
}

// requireWorkloadConverged waits until the workload's tables equal the source and the slot caught
// up, and requires coverage without a gap and no stream segment ended: a crash, a restart or a
// takeover that kept the slot is no gap, and the ledger knows it.
func requireWorkloadConverged(t *testing.T, env *pgtest.Env) {
	t.Helper()
	pgtest.WaitConverged(t, env, "acct", "id")
	pgtest.WaitConverged(t, env, "ledger", "id")
	pgtest.WaitSlotCaughtUp(t, env)
	waitCovered(t, env)
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_segments where end_lsn is not null`); n != 0 {
		t.Errorf("%d stream segments ended although the slot was kept, want 0", n)
	}
}

func TestCrashAndRestartLosesNothing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		point string
		at    int
	}{
		{"after-begin", 20},
		{"mid-transaction", 15},
		{"after-commit", 5},
		{"during-load", 5}, // acct has 3 chunks: at least 2 of ledger's are in
	}
	for _, c := range cases {
		t.Run(c.point, func(t *testing.T) {
			t.Parallel() // each case has its own databases and slot
			env := pgtest.New(t)
			setupCrashTables(t, env)
			stopWorkload := workload(t, env)
			out, err := crashChildCmd(env, c.point, c.at).CombinedOutput()
			requireKilled(t, err, out)
			if c.point == "during-load" && primaryKeys(t, env, "acct", "ledger") == 2 {
				t.Errorf("both tables have their primary key after a kill mid-load: the bulk load did not defer it")
			}
			finishAfterRestart(t, env, stopWorkload)
			if n := primaryKeys(t, env, "acct", "ledger"); n != 2 {
				t.Errorf("%d of 2 tables have their primary key after the restart", n)
			}
			if c.point == "during-load" {
				// The restart resumed the interrupted load: the chunks completed before the kill
				// kept their snapshot LSN, the rest were read at the new one.
				got := pgtest.Rows(t, env.Target, `select trigger || ' ' || status from pgconverge.backfill_runs order by id`)
				if d := pgtest.Diff([]string{"initial failed", "initial completed"}, got); d != "" {
					t.Errorf("backfill runs: %s", d)
				}
				got = pgtest.Rows(t, env.Target, `select table_name || ' ' || status from pgconverge.backfills order by id`)
				if d := pgtest.Diff([]string{"acct completed", "ledger completed"}, got); d != "" {
					t.Errorf("table backfills: %s", d)
				}
				got = pgtest.Rows(t, env.Target, `select count(distinct c.snapshot_lsn)::text || ' ' || count(*) filter (where c.snapshot_lsn is null)::text
from pgconverge.backfill_chunks c join pgconverge.backfills b on b.id = c.backfill_id where b.table_name = 'ledger'`)
				if d := pgtest.Diff([]string{"2 0"}, got); d != "" {
					t.Errorf("ledger chunks (distinct snapshot LSNs, chunks not completed): %s", d)
				}
			}
		})
	}
}

// TestRandomKillsUnderLoad kills the daemon with SIGKILL at random moments while the workload
// runs, restarts it each time, and finally requires the target to equal the source.
func TestRandomKillsUnderLoad(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	setupCrashTables(t, env)
	stopWorkload := workload(t, env)
	seed := time.Now().UnixNano()
	t.Logf("random seed %d", seed)
	rnd := rand.New(rand.NewPCG(uint64(seed), 0))
	for round := 0; round < 6; round++ {
		child := crashChildCmd(env, "none", 0)
		var out bytes.Buffer
		child.Stdout, child.Stderr = &out, &out
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(200+rnd.IntN(2800)) * time.Millisecond) // the moment of the kill is the point
		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		requireKilled(t, child.Wait(), out.Bytes())
	}
	finishAfterRestart(t, env, stopWorkload)
}
