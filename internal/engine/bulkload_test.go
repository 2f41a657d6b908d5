package engine

import (
	"context"
	"fmt"
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

// A backfill of an empty target table that no stream follows is a bulk load: the rows are copied
// without the primary key, which is built when the table completes, and the table is cut by
// block ranges. Killed after five chunks, it leaves the table without its key; the next run
// builds the key before it copies anything, keeps the five chunks, and the table ends equal to
// the source with every key once.
func TestBulkLoadBuildsTheKeyAtTheEndAndAfterAKill(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id bigint primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`, `analyze big`)
	out, err := crashChildCmd(env, "backfill-chunk", 5).CombinedOutput()
	requireKilled(t, err, out)
	if n := primaryKeys(t, env, "big"); n != 0 {
		t.Errorf("after the kill mid-load the target table has %d primary keys, want 0 (deferred)", n)
	}
	// The rows were stored in id order: the five chunks of blocks hold ids 1 to kept.
	kept := pgtest.Scalar[int64](t, env.Target, `select count(*) from big`)
	if top := pgtest.Scalar[int64](t, env.Target, `select coalesce(max(id), 0) from big`); kept < 4000 || kept > 6000 || top != kept {
		t.Fatalf("after the kill the target holds %d rows up to id %d, want ids 1 to about 5,000 (5 chunks of about 1,000)", kept, top)
	}
	got := pgtest.Rows(t, env.Target, `select key_columns::text || ' ' || (source_filenode > 0)::text from pgconverge.backfills`)
	if d := pgtest.Diff([]string{"{ctid} true"}, got); d != "" {
		t.Errorf("the bulk load's plan (key columns, source file recorded): %s", d)
	}
	// Changes outside the kept chunks (no stream follows the table to bring those of kept ones;
	// the updated rows' new versions are stored in new blocks).
	pgtest.Exec(t, env.Source, fmt.Sprintf(`delete from big where id > %d and id %% 1000 = 0`, kept),
		fmt.Sprintf(`update big set v = 'changed' where id > %d and id %% 999 = 0`, kept), `insert into big values (20001, 'new')`)
	rest := pgtest.Scalar[int64](t, env.Source, `select count(*) from big where id > $1`, kept)
	cfg := testBackfillConfig(t, env, "public.big")
	watch := &keyWatch{conn: pgtest.Connect(t, env.TargetURL)}
	cfg.AfterChunk = watch.note
	rep := backfillNow(t, cfg)
	keyed := watch.take(t)
	if rep.Kept != kept || rep.Rows != rest {
		t.Errorf("kept %d rows and read %d, want %d and %d", rep.Kept, rep.Rows, kept, rest)
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

// An interrupted bulk load is not resumed once the source table was rewritten (VACUUM FULL moves
// every row to other blocks without a change to stream): the next run reads the table whole,
// abandons the old backfill, and the table ends equal with every key once.
func TestBlockPlanNotResumedAfterARewrite(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id bigint primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`, `analyze big`)
	out, err := crashChildCmd(env, "backfill-chunk", 2).CombinedOutput()
	requireKilled(t, err, out)
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
