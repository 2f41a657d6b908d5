package engine_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"

	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// partitioned creates on the source table p, partitioned by list of region, with partitions p_eu
// and p_us (itself partitioned by range of id, into p_us_low and p_us_high), and 300 rows.
func partitioned(t *testing.T, env *pgtest.Env) {
	t.Helper()
	pgtest.Exec(t, env.Source,
		`create table p (id int, region text, v text, primary key (id, region)) partition by list (region)`,
		`create table p_eu partition of p for values in ('eu')`,
		`create table p_us partition of p for values in ('us') partition by range (id)`,
		`create table p_us_low partition of p_us for values from (0) to (1000)`,
		`create table p_us_high partition of p_us for values from (1000) to (100000)`,
		`insert into p select g, case when g % 2 = 0 then 'eu' else 'us' end, 'v' || g from generate_series(1, 300) g`,
		`insert into p select g, 'us', 'high' || g from generate_series(1000, 1099) g`)
}

// streamingPartitioned creates the partitioned table p (partitioned), starts the daemon on it and
// waits until the target holds it and the daemon streams.
func streamingPartitioned(t *testing.T) *pgtest.Env {
	t.Helper()
	env := pgtest.New(t)
	partitioned(t, env)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "p", "id, region")
	pgtest.WaitStreaming(t, env)
	return env
}

// Without --tables a partitioned table is selected as one table and its partitions are not: the
// target gets one plain table with the rows of every partition, and the publication pgconverge
// creates publishes the partitions' changes under the table's name.
func TestPartitionedTableIsOneTargetTable(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	partitioned(t, env)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "p", "id, region")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_class where relname like 'p\_%' and relkind in ('r', 'p')`); n != 0 {
		t.Errorf("%d partitions have a target table, want 0", n)
	}
	if k := pgtest.Scalar[string](t, env.Target, `select relkind::text from pg_class where oid = 'public.p'::regclass`); k != "r" {
		t.Errorf("target table p has relkind %q, want a plain table (r)", k)
	}
	pub := `select pubviaroot from pg_publication where pubname = $1`
	if !pgtest.Scalar[bool](t, env.Source, pub, env.Name) {
		t.Error("the publication does not publish via the partition root")
	}
	waitCovered(t, env)
}

// An UPDATE of the partition key moves a row to another partition; pgoutput sends it as a delete
// and an insert under the root's name, and the target converges (the old key is a tombstone).
func TestRowMovingBetweenPartitionsConverges(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	partitioned(t, env)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.p"}
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source,
		`update p set region = 'us' where id = 2`,                 // p_eu -> p_us_low
		`update p set id = id + 5000 where id = 3`,                // p_us_low -> p_us_high
		`update p set region = 'eu', v = 'moved' where id = 1001`, // p_us_high -> p_eu
		`update p set v = 'stays' where id = 4`, `delete from p where id = 5`, `insert into p values (7000, 'eu', 'new')`)
	pgtest.WaitConverged(t, env, "p", "id, region")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from p where _cdc_deleted and (id, region) in ((2, 'eu'), (3, 'us'), (1001, 'us'))`); n != 3 {
		t.Errorf("%d tombstones for the moved rows' old keys, want 3", n)
	}
}

// A partitioned table needs a publication that publishes via the partition root: an existing one
// that does not is refused, naming the fix.
func TestPartitionedTableNeedsARootPublication(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	partitioned(t, env)
	pgtest.Exec(t, env.Source, `create publication `+env.Name+` for table p`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.p"}
	requireRefusal(t, cfg, `ALTER PUBLICATION "`+env.Name+`" SET (publish_via_partition_root = true)`)
}

// A publication of a partitioned table without publish_via_partition_root publishes its
// partitions under their own names: the default selection takes the partitions, each replicated
// as a table of its own.
func TestPartitionsOfAPlainPublicationAreTables(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	partitioned(t, env)
	pgtest.Exec(t, env.Source, `create publication `+env.Name+` for table p`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `update p set v = 'changed' where id <= 10`, `insert into p values (2000, 'us', 'new')`)
	for _, leaf := range []string{"p_eu", "p_us_low", "p_us_high"} {
		pgtest.WaitConverged(t, env, leaf, "id, region")
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_class where relname in ('p', 'p_us')`); n != 0 {
		t.Errorf("%d partitioned tables have a target table, want 0", n)
	}
	waitCovered(t, env)
}

// ATTACH PARTITION of a table with rows puts them in the partitioned table without any change in
// the stream: the membership change is a coverage gap, reported while --on-gap=alert leaves it,
// and backfilled by the default --on-gap=backfill.
func TestAttachedPartitionIsAGapUntilBackfilled(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	partitioned(t, env)
	pgtest.Exec(t, env.Source, `create table p_asia (id int, region text, v text, primary key (id, region))`,
		`insert into p_asia select g, 'asia', 'a' || g from generate_series(1, 50) g`)
	alert := testConfig(t, env)
	alert.OnGap = OnGapAlert
	d := startDaemon(t, alert)
	pgtest.WaitConverged(t, env, "p", "id, region")
	waitCovered(t, env)
	from := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Exec(t, env.Source, `alter table p attach partition p_asia for values in ('asia')`)
	to := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Eventually(t, 60*time.Second, "a gap for public.p", func() (bool, string) {
		rep, code := coverageOf(t, env)
		p := tableReport(t, rep, "public.p")
		return code == exitGap && p.Status == coverage.GapStatus, fmt.Sprintf("exit %d, %+v", code, p)
	})
	rep, _ := coverageOf(t, env)
	requireGapCovers(t, rep, "public.p", coverage.GapStatus, from, to)
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from p where region = 'asia'`); n != 0 {
		t.Fatalf("%d attached rows reached the target under --on-gap=alert, want 0", n)
	}
	d.Stop(t)

	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "p", "id, region")
	waitCovered(t, env)
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_runs where trigger = 'gap' and status = 'completed'`); n != 1 {
		t.Errorf("%d completed gap backfill runs, want 1", n)
	}
}

// DETACH PARTITION removes its rows from the partitioned table without deletes in the stream; the
// reload that the membership change causes tombstones them.
func TestDetachedPartitionRowsAreTombstoned(t *testing.T) {
	t.Parallel()
	env := streamingPartitioned(t)
	pgtest.Exec(t, env.Source, `alter table p_us detach partition p_us_high`, `insert into p values (5000, 'eu', 'after the detach')`)
	pgtest.WaitConverged(t, env, "p", "id, region")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from p where _cdc_deleted and id between 1000 and 1099`); n != 100 {
		t.Errorf("%d tombstones for the detached partition's 100 rows", n)
	}
	waitCovered(t, env)
}

// A TRUNCATE of one partition alone is not published via the partition root (pgoutput skips
// it): the partition's new storage changes the membership, and the reload removes its rows.
func TestTruncatedPartitionIsReloaded(t *testing.T) {
	t.Parallel()
	env := streamingPartitioned(t)
	pgtest.Exec(t, env.Source, `truncate p_eu`, `insert into p values (10000, 'eu', 'after the truncate')`)
	pgtest.WaitConverged(t, env, "p", "id, region")
	waitCovered(t, env)
}

// Changes made to a partition while it was detached are not published via the root; detached and
// attached again within one transaction, its oid and storage are the same, but its catalog rows
// are new: the table is reloaded.
func TestPartitionChangedWhileDetachedIsReloaded(t *testing.T) {
	t.Parallel()
	env := streamingPartitioned(t)
	pgtest.Exec(t, env.Source, `begin; alter table p detach partition p_eu; update p_eu set v = 'while detached' where id <= 50;
delete from p_eu where id > 280; insert into p_eu values (5000, 'eu', 'new while detached');
alter table p attach partition p_eu for values in ('eu'); commit`)
	pgtest.WaitConverged(t, env, "p", "id, region")
	waitCovered(t, env)
}

// A backfill of a partitioned table stops when its partitions change under its snapshot: the
// snapshot would read the current partitions and show rows the table did not have then, or miss
// rows it had. Run again, it completes.
func TestBackfillStopsWhenPartitionsChange(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"attach":   `alter table p attach partition p_asia for values in ('asia')`,
		"detach":   `alter table p detach partition p_eu`,
		"truncate": `truncate p_eu`,
	}
	for name, ddl := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each case has its own databases and slot
			env := pgtest.New(t)
			partitioned(t, env)
			pgtest.Exec(t, env.Source, `create table p_asia (id int, region text, v text, primary key (id, region))`,
				`insert into p_asia values (1, 'asia', 'x')`)
			cfg := testBackfillConfig(t, env, "public.p")
			cfg.ChunkRows, cfg.Workers = 50, 1
			end := backfillAfterFirstChunkEnd(t, cfg, true)
			pgtest.Exec(t, env.Source, `set lock_timeout = '30s'`, ddl)
			if _, err := end(); !errors.Is(err, backfill.ErrRewritten) {
				t.Fatalf("backfill across %s: %v, want %v", name, err, backfill.ErrRewritten)
			}
			backfillNow(t, cfg)
			pgtest.WaitConverged(t, env, "p", "id, region")
		})
	}
}
