package engine_test

import (
	"testing"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// --tables patterns select the tables they match (one without a key is kept by snapshots), and
// follow tables created later, or given a key later, from their first row: each is added to the
// publication, loaded and streamed, with coverage covered.
func TestTablePatternsFollowNewTables(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create schema sales`,
		`create table a (id int primary key, v text)`, `insert into a values (1, 'a')`,
		`create table nokey (v text)`,
		`create table sales.order_1 (id int primary key)`, `insert into sales.order_1 values (1)`,
		`create table sales.other (id int primary key)`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.*,sales.order_*"}
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitConverged(t, env, "sales.order_1", "id")
	pgtest.WaitStreaming(t, env)
	if pgtest.Scalar[bool](t, env.Target, `select to_regclass('sales.other') is not null`) {
		t.Errorf("sales.other was replicated, but no pattern selects it")
	}
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_publication_tables where pubname = $1 and tablename = 'nokey'`, env.Name); n != 0 {
		t.Errorf("nokey, without a key, was published")
	}
	waitSameMultiset(t, env, "nokey") // kept by snapshots

	pgtest.Exec(t, env.Source, `begin`, `create table sales.order_2 (id int primary key, v text)`,
		`insert into sales.order_2 select g, 'first' from generate_series(1, 100) g`, `commit`,
		`insert into sales.order_2 values (101, 'later')`, `update sales.order_2 set v = 'changed' where id <= 10`,
		`alter table nokey add column id serial primary key`, `insert into nokey (v) values ('keyed now')`)
	pgtest.WaitConverged(t, env, "sales.order_2", "id")
	pgtest.WaitConverged(t, env, "nokey", "id")
	pgtest.Exec(t, env.Source, `delete from sales.order_2 where id > 90`, `insert into a values (2, 'b')`)
	pgtest.WaitConverged(t, env, "sales.order_2", "id")
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	d.RequireRunning(t)
}

// With a publication FOR TABLES IN SCHEMA and no --tables, a table created in the schema later is
// followed from its first row.
func TestSchemaPublicationFollowsNewTables(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 15, "row filters, column lists and schema publications")
	pub := `"` + env.Name + `"`
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `insert into a values (1)`,
		`create publication `+pub+` for tables in schema public`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `begin`, `create table b (id int primary key, v text)`,
		`insert into b select g, 'first' from generate_series(1, 50) g`, `commit`,
		`update b set v = 'changed' where id <= 5`, `insert into b values (51, 'later')`)
	pgtest.WaitConverged(t, env, "b", "id")
	waitCovered(t, env)
	d.RequireRunning(t)
}

// A partitioned table created later that a pattern matches, while pgconverge's publication
// publishes partitions under their own names, is skipped with the fix; the daemon streams on.
func TestPatternSkipsAPartitionedTableThePublicationCannotCarry(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `insert into a values (1)`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.*"}
	mon := &retryCounter{}
	cfg.Monitor = mon
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `create table p (id int primary key) partition by range (id)`,
		`create table p_1 partition of p for values from (0) to (100)`, `insert into p values (1)`)
	after := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Exec(t, env.Source, `insert into a values (2)`)
	waitSpansConfirmed(t, env, after, 1)
	pgtest.WaitConverged(t, env, "a", "id")
	if c := mon.counts(); len(c) != 0 {
		t.Errorf("sessions retried %v, want none", c)
	}
	d.RequireRunning(t)
}
