package engine

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

// A backfill of an empty target table that no stream follows is a bulk load: the rows are copied
// without the primary key, which is built when the table completes. Killed after five chunks, it
// leaves the table without its key; the next run builds the key before it copies anything, keeps
// the five chunks, and the table ends equal to the source with every key once.
func TestBulkLoadBuildsTheKeyAtTheEndAndAfterAKill(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id bigint primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 20000) g`)
	out, err := crashChildCmd(env, "backfill-chunk", 5).CombinedOutput()
	requireKilled(t, err, out)
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
