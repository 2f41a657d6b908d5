package engine_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/operator"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// tombstoneCounts returns the tombstones of target table a and the deleted entries of the table
// without a key k.
func tombstoneCounts(t *testing.T, env *pgtest.Env) (int64, int64) {
	t.Helper()
	return pgtest.Scalar[int64](t, env.Target, `select count(*) from a where _cdc_deleted`),
		pgtest.Scalar[int64](t, env.Target, `select count(*) from k where _cdc_deleted`)
}

// Tombstones stay while younger than --tombstone-retention, then go once every slot that follows
// the table applied past them: the fence is raised first, so the target still converges after a
// restart that replays the stream, and a key deleted then inserted again comes back.
func TestTombstonesArePrunedAfterTheirRetention(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`,
		`insert into a select g, 'v' || g from generate_series(1, 100) g`,
		`create table k (x int, y text)`, `alter table k replica identity full`,
		`insert into k values (1, 'dup'), (1, 'dup'), (2, 'one')`)
	cfg := testConfig(t, env)
	cfg.TombstoneRetention = time.Hour
	cfg.Knobs.TombstonePruneEvery = 200 * time.Millisecond
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `delete from a where id <= 50`, `delete from k where ctid = (select min(ctid) from k where x = 1)`)
	pgtest.WaitConverged(t, env, "a", "id")
	waitSameMultiset(t, env, "k")
	recorded := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.tombstone_horizons where table_name = 'a'`)
	pgtest.Eventually(t, 60*time.Second, "three more pruning rounds", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.tombstone_horizons where table_name = 'a'`)
		return n >= recorded+3, fmt.Sprintf("%d horizons recorded", n)
	})
	if a, k := tombstoneCounts(t, env); a != 50 || k != 1 {
		t.Fatalf("%d tombstones in a and %d deleted entries in k within the retention, want 50 and 1", a, k)
	}
	deletedAt := pgtest.Scalar[string](t, env.Target, `select max(_cdc_lsn)::text from a where _cdc_deleted`)
	d.Stop(t)

	cfg.TombstoneRetention = time.Millisecond
	d = startDaemon(t, cfg)
	pgtest.Eventually(t, 60*time.Second, "tombstones pruned", func() (bool, string) {
		a, k := tombstoneCounts(t, env)
		return a == 0 && k == 0, fmt.Sprintf("%d tombstones in a, %d deleted entries in k", a, k)
	})
	if raised := pgtest.Scalar[bool](t, env.Target, `select fence_lsn >= $1::pg_lsn from pgconverge.tables where table_name = 'a'`, deletedAt); !raised {
		t.Errorf("fence of a is below its tombstones' version %s after pruning, want it raised past them", deletedAt)
	}
	d.Stop(t)
	// Replayed from the target's progress, the stream applies nothing older than the fence.
	d = startDaemon(t, cfg)
	pgtest.Exec(t, env.Source, `insert into a values (1, 'again')`, `update a set v = 'later' where id = 60`,
		`insert into k values (1, 'dup')`)
	pgtest.WaitConverged(t, env, "a", "id")
	waitSameMultiset(t, env, "k")
	d.RequireRunning(t)
}

// A backfill that reads an older snapshot holds the table's fence down while it runs: pruning
// rounds pass over the table (another table is pruned meanwhile), so the backfill's rows are
// applied, and the table's tombstones go once it ended.
func TestRunningBackfillHoldsTombstonesBack(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`,
		`insert into a select g, 'v' || g from generate_series(1, 3000) g`,
		`create table b (id int primary key)`, `insert into b select generate_series(1, 10)`)
	cfg := testConfig(t, env)
	cfg.TombstoneRetention = time.Millisecond
	cfg.Knobs.TombstonePruneEvery = 200 * time.Millisecond
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitStreaming(t, env)

	held, release := make(chan struct{}), make(chan struct{})
	bcfg := testBackfillConfig(t, env, "public.a")
	bcfg.Workers = 1 // held at its first chunk, the run cannot complete the table meanwhile
	first := true
	bcfg.AfterChunk = func(string, int64) {
		if first {
			first = false
			close(held)
			<-release
		}
	}
	done := make(chan error, 1)
	go func() { _, err := operator.Backfill(t.Context(), bcfg); done <- err }()
	<-held
	fence := pgtest.Scalar[string](t, env.Target, `select fence_lsn::text from pgconverge.tables where table_name = 'a'`)
	pgtest.Exec(t, env.Source, `delete from a where id > 2000`, `delete from b where id <= 5`)
	pgtest.Eventually(t, 60*time.Second, "b pruned while a is backfilled", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from b where _cdc_deleted`)
		return n == 0 && pgtest.Scalar[int64](t, env.Target, `select count(*) from b`) == 5, fmt.Sprintf("%d tombstones in b", n)
	})
	if now := pgtest.Scalar[string](t, env.Target, `select fence_lsn::text from pgconverge.tables where table_name = 'a'`); now != fence {
		t.Errorf("fence of a moved from %s to %s while its backfill ran", fence, now)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("backfill: %v", err)
	}
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.Eventually(t, 60*time.Second, "a pruned after its backfill", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from a where _cdc_deleted`)
		return n == 0, fmt.Sprintf("%d tombstones in a", n)
	})
	pgtest.WaitConverged(t, env, "a", "id")
}

// A table kept by snapshots only leaves the copies each refresh replaced: they are pruned too,
// and the target still holds the table as of the last refresh.
func TestSnapshotOnlyRefreshesArePruned(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `insert into a values (1)`,
		`create table s (x int, y text)`, `insert into s values (1, 'dup'), (1, 'dup'), (2, 'one')`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"a", "s"}
	cfg.TombstoneRetention = time.Millisecond
	cfg.Knobs.TombstonePruneEvery = 200 * time.Millisecond
	startDaemon(t, cfg)
	waitSameMultiset(t, env, "s")
	for i := 0; i < 3; i++ {
		pgtest.Exec(t, env.Source, fmt.Sprintf(`insert into s values (%d, 'refresh')`, 10+i))
		backfillNow(t, testBackfillConfig(t, env, "public.s"))
	}
	pgtest.Eventually(t, 60*time.Second, "replaced copies pruned", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from s where _cdc_deleted`)
		return n == 0, fmt.Sprintf("%d replaced copies in s", n)
	})
	waitSameMultiset(t, env, "s")
}
