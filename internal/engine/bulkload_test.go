package engine_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// primaryKeys returns how many of tables (target names) have a primary key.
func primaryKeys(t *testing.T, env *pgtest.Env, tables ...string) int64 {
	t.Helper()
	return pgtest.Scalar[int64](t, env.Target, primaryKeysSQL, tables)
}

const primaryKeysSQL = `select count(*) from pg_constraint where contype = 'p' and conrelid = any($1::regclass[])`

// keyWatch records, from hooks that workers call concurrently, how many primary keys the target
// table big has, over a connection of its own.
type keyWatch struct {
	mu   sync.Mutex
	conn *pgx.Conn
	seen []int64
	err  error
}

func (k *keyWatch) note(string, int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var n int64
	if err := k.conn.QueryRow(context.Background(), primaryKeysSQL, []string{"big"}).Scan(&n); err != nil {
		k.err = err
	}
	k.seen = append(k.seen, n)
}

func (k *keyWatch) take(t *testing.T) []int64 {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		t.Fatal(k.err)
	}
	seen := k.seen
	k.seen = nil
	return seen
}

// killedBulkLoad makes a source table big of 20,000 rows (analyzed; partitioned when
// partitioned is set) and a `pgconverge backfill` of it into the empty target in a child
// process, SIGKILLed after chunks chunks of about 1,000 rows completed. A plain table's first
// 300 rows are deleted and vacuumed away first, so its first blocks have room for new rows.
func killedBulkLoad(t *testing.T, chunks int, partitioned bool) *pgtest.Env {
	t.Helper()
	env := pgtest.New(t)
	if partitioned {
		pgtest.Exec(t, env.Source, `create table big (id bigint primary key, v text) partition by range (id)`,
			`create table big_low partition of big for values from (minvalue) to (10001)`,
			`create table big_high partition of big for values from (10001) to (maxvalue)`)
	} else {
		pgtest.Exec(t, env.Source, `create table big (id bigint primary key, v text)`)
	}
	pgtest.Exec(t, env.Source, `insert into big select g, md5(g::text) from generate_series(1, 20000) g`)
	if !partitioned {
		pgtest.Exec(t, env.Source, `delete from big where id <= 300`, `vacuum big`)
	}
	pgtest.Exec(t, env.Source, `analyze big`)
	out, err := crashChildCmd(env, "backfill-chunk", chunks).CombinedOutput()
	requireKilled(t, err, out)
	return env
}

// A backfill of an empty target table that no stream follows is a bulk load: the rows are copied
// without the primary key, which is built when the table completes. Cut along its key (a
// partitioned table) and killed after five chunks, it leaves the table without its key; the next
// run builds the key before it copies anything, keeps the five chunks, and the table ends equal
// to the source with every key once.
func TestBulkLoadBuildsTheKeyAtTheEndAndAfterAKill(t *testing.T) {
	t.Parallel()
	env := killedBulkLoad(t, 5, true)
	if n := primaryKeys(t, env, "big"); n != 0 {
		t.Errorf("after the kill mid-load the target table has %d primary keys, want 0 (deferred)", n)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from big`); n != 5000 {
		t.Errorf("after the kill the target holds %d rows, want the 5 chunks of 1,000", n)
	}
	// Changes outside the kept chunks (no stream follows the table to bring those of kept ones).
	pgtest.Exec(t, env.Source, `delete from big where id > 5000 and id % 1000 = 0`, `update big set v = 'changed' where id > 5000 and id % 999 = 0`,
		`insert into big values (20001, 'new')`)
	cfg := testBackfillConfig(t, env, "public.big")
	watch := &keyWatch{conn: pgtest.Connect(t, env.TargetURL)}
	cfg.AfterChunk = watch.note
	rep := backfillNow(t, cfg)
	keyed := watch.take(t)
	if rep.Kept != 5000 || rep.Rows != 14986 {
		t.Errorf("kept %d rows and read %d, want 5000 and 14986", rep.Kept, rep.Rows)
	}
	for i, n := range keyed {
		if n != 1 {
			t.Fatalf("after chunk %d of the resumed run the table had %d primary keys, want 1: the run must build the key before it copies", i+1, n)
		}
	}
	pgtest.WaitConverged(t, env, "big", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) - count(distinct id) from big`); n != 0 {
		t.Errorf("%d keys stored twice", n)
	}

	// A new backfill of a table the target already holds is no bulk load: the key stays.
	backfillNow(t, cfg)
	keyed = watch.take(t)
	if len(keyed) == 0 || keyed[0] != 1 {
		t.Errorf("a backfill of a table the target holds dropped its key: primary keys after each chunk %v", keyed)
	}
}

// A bulk load of a plain table is cut by block ranges. Killed after five chunks and run again
// without a stream following the table, it is not resumed: rows stored outside the copied blocks
// may have moved into them since (here updated rows' new versions and inserted rows, stored in
// the space the deleted first rows left), and only a stream would bring them. The table, which
// holds only the interrupted load's rows, is emptied and bulk loaded again, and ends equal.
//
// Serial: VACUUM must free the first blocks, which another test's open snapshot or slot creation
// on the source cluster can hold back (the horizon is cluster-wide then).
func TestBlockPlanStartsOverWithoutAStream(t *testing.T) {
	env := killedBulkLoad(t, 5, false)
	if n := primaryKeys(t, env, "big"); n != 0 {
		t.Errorf("after the kill mid-load the target table has %d primary keys, want 0 (deferred)", n)
	}
	copied := pgtest.Scalar[int64](t, env.Target, `select count(*) from big`)
	if copied < 3000 || copied > 7000 {
		t.Fatalf("after the kill the target holds %d rows, want about 5,000 (5 chunks of about 1,000)", copied)
	}
	got := pgtest.Rows(t, env.Target, `select key_columns::text || ' ' || (source_filenode > 0)::text from pgconverge.backfills`)
	if d := pgtest.Diff([]string{"{ctid} true"}, got); d != "" {
		t.Errorf("the bulk load's plan (key columns, source file recorded): %s", d)
	}
	pgtest.Exec(t, env.Source, `update big set v = 'moved' where id between 19001 and 19100`,
		`insert into big select g, 'new' from generate_series(30001, 30100) g`)
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from big where (id between 19001 and 19100 or id > 30000) and ctid < '(3,0)'`); n == 0 {
		t.Fatal("no changed row was stored in the first blocks: the test shows nothing")
	}
	cfg := testBackfillConfig(t, env, "public.big")
	watch := &keyWatch{conn: pgtest.Connect(t, env.TargetURL)}
	cfg.AfterChunk = watch.note
	rep := backfillNow(t, cfg)
	if want := pgtest.Scalar[int64](t, env.Source, `select count(*) from big`); rep.Kept != 0 || rep.Rows != want {
		t.Errorf("kept %d rows and read %d, want 0 and %d", rep.Kept, rep.Rows, want)
	}
	if keyed := watch.take(t); len(keyed) == 0 || slices.Max(keyed) != 0 {
		t.Errorf("primary keys after each chunk of the second run %v, want none: a bulk load again", keyed)
	}
	pgtest.WaitConverged(t, env, "big", "id")
	if n := primaryKeys(t, env, "big"); n != 1 {
		t.Errorf("after the second run the target table has %d primary keys, want 1", n)
	}
	got = pgtest.Rows(t, env.Target, `select status || ' ' || key_columns::text from pgconverge.backfills order by id`)
	if d := pgtest.Diff([]string{"abandoned {ctid}", "completed {ctid}"}, got); d != "" {
		t.Errorf("table backfills: %s", d)
	}
}

// An interrupted bulk load is not resumed once the source table was rewritten (VACUUM FULL moves
// every row to other blocks without a change to stream): the next run reads the table whole,
// abandons the old backfill, and the table ends equal with every key once.
func TestBlockPlanNotResumedAfterARewrite(t *testing.T) {
	t.Parallel()
	env := killedBulkLoad(t, 2, false)
	pgtest.Exec(t, env.Source, `delete from big where id % 3 = 0`, `vacuum full big`)
	rep := backfillNow(t, testBackfillConfig(t, env, "public.big"))
	if want := pgtest.Scalar[int64](t, env.Source, `select count(*) from big`); rep.Kept != 0 || rep.Rows != want {
		t.Errorf("kept %d rows and read %d, want 0 and %d", rep.Kept, rep.Rows, want)
	}
	pgtest.WaitConverged(t, env, "big", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) - count(distinct id) from big`); n != 0 {
		t.Errorf("%d keys stored twice", n)
	}
	got := pgtest.Rows(t, env.Target, `select status from pgconverge.backfills order by id`)
	if d := pgtest.Diff([]string{"abandoned", "completed"}, got); d != "" {
		t.Errorf("table backfills: %s", d)
	}
}

// The daemon's initial load of a new table copies its rows before it builds the key; the stream
// then merges on that key.
func TestInitialLoadBuildsTheKeyAfterTheRows(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id bigint primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 5000) g`)
	cfg := testConfig(t, env)
	cfg.ChunkRows = 1000
	watch := &keyWatch{conn: pgtest.Connect(t, env.TargetURL)}
	cfg.Knobs.AfterLoadChunk = watch.note
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	keyed := watch.take(t)
	if len(keyed) < 5 || slices.Max(keyed) != 0 {
		t.Errorf("primary keys of the target table after each load chunk: %v, want at least 5 chunks, none with it", keyed)
	}
	if n := primaryKeys(t, env, "big"); n != 1 {
		t.Errorf("after the load the target table has %d primary keys, want 1", n)
	}
	pgtest.Exec(t, env.Source, `update big set v = 'streamed' where id % 100 = 0`, `delete from big where id = 7`)
	pgtest.WaitConverged(t, env, "big", "id")
}
