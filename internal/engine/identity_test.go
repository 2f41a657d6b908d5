package engine_test

import (
	"testing"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// keyShape is one way a table identifies its rows: its DDL, rows loaded from the snapshot, changes
// streamed afterwards, and the key the target table must get.
type keyShape struct {
	name   string
	create []string // DDL and rows before the daemon starts (backfill path)
	stream []string // changes after it streams, key changes included
	key    string   // the target's primary key columns, comma-separated in index order
	user   bool     // a key column has a user-defined type: compare text only (compare_test.go)
}

var keyShapes = []keyShape{
	// FULL sends whole old rows; the primary key stays the key.
	{name: "full_pk", key: "id",
		create: []string{`create table full_pk (id int primary key, n int, body text)`,
			`alter table full_pk replica identity full`, `alter table full_pk alter column body set storage external`,
			`insert into full_pk select g, 0, repeat(md5(g::text), 100) from generate_series(1, 20) g`},
		stream: []string{`insert into full_pk select g, 0, repeat(md5(g::text), 100) from generate_series(21, 30) g`,
			`update full_pk set n = n + 1`, `update full_pk set id = id + 100 where id % 5 = 0`, `delete from full_pk where id % 7 = 0`}},
	// A unique index on NOT NULL columns as replica identity, no primary key.
	{name: "using_index", key: "a, b",
		create: []string{`create table using_index (a int not null, b text not null, v text)`,
			`create unique index using_index_ab on using_index (a, b)`, `alter table using_index replica identity using index using_index_ab`,
			`insert into using_index select g % 5, 'b' || g, 'v' from generate_series(1, 50) g`},
		stream: []string{`insert into using_index values (9, 'new', 'n')`, `update using_index set v = 'u' where a = 1`,
			`update using_index set b = b || '!' where a = 2`, `delete from using_index where a = 3`}},
	// A replica identity index that is not the primary key: the index is the key.
	{name: "index_besides_pk", key: "code",
		create: []string{`create table index_besides_pk (id int primary key, code text not null, v text)`,
			`create unique index index_besides_pk_code on index_besides_pk (code)`,
			`alter table index_besides_pk replica identity using index index_besides_pk_code`,
			`insert into index_besides_pk select g, 'c' || g, 'v' from generate_series(1, 20) g`},
		stream: []string{`insert into index_besides_pk values (21, 'c21', 'n')`, `update index_besides_pk set id = id + 1000 where id <= 5`,
			`update index_besides_pk set code = code || '!' where id between 6 and 10`, `delete from index_besides_pk where id > 18`}},
	// INCLUDE columns are carried by the index but are not part of the key.
	{name: "pk_include", key: "a",
		create: []string{`create table pk_include (a int, b text, v text, primary key (a) include (b))`,
			`insert into pk_include select g, 'b' || g, 'v' from generate_series(1, 20) g`},
		stream: []string{`update pk_include set b = 'changed' where a <= 5`, `update pk_include set a = a + 100 where a between 6 and 8`,
			`delete from pk_include where a > 18`}},
	// A key of text, uuid, numeric and timestamptz columns, whose values print differently under
	// other session settings; every key column changes in some update.
	{name: "multi_typed", key: "t, u, n, ts",
		create: []string{`create table multi_typed (t text, u uuid, n numeric, ts timestamptz, v int, primary key (t, u, n, ts))`,
			`insert into multi_typed select k, md5(g::text)::uuid, g / 3.0, timestamptz '2020-03-29 00:30 Europe/Berlin' + g * interval '37 minutes', g
  from generate_series(1, 30) g, unnest(array['', ' ', 'a b', 'ünï', 'Z', 'z']) k`},
		stream: []string{`insert into multi_typed values ('new', gen_random_uuid(), 1.10, '0044-03-15 12:00+00 BC', 0), ('new', gen_random_uuid(), 'NaN', 'infinity', 0)`,
			`update multi_typed set v = -v where n < 2`, `update multi_typed set t = t || '.' where v % 7 = 0`,
			`update multi_typed set u = gen_random_uuid() where v % 7 = 1`, `update multi_typed set n = n * 10 where v % 7 = 2`,
			`update multi_typed set ts = ts + interval '1 microsecond' where v % 7 = 3`, `delete from multi_typed where v % 7 = 4`}},
	// Keys whose equal values have several spellings or bit patterns: char(n) padding, float8
	// -0 = 0 and NaN, interval '1 mon' = '30 days', bytea.
	{name: "bpchar_key", key: "k",
		create: []string{`create table bpchar_key (k char(4) primary key, v int)`, `insert into bpchar_key values ('a', 1), ('b  ', 2), ('', 3)`},
		stream: []string{`update bpchar_key set k = 'c' where v = 1`, `update bpchar_key set v = 5 where k = 'b'`, `delete from bpchar_key where k = ''`}},
	{name: "float_key", key: "f",
		create: []string{`create table float_key (f float8 primary key, v int)`, `insert into float_key values ('NaN', 1), ('-0', 2), ('5e-324', 3), ('0.1', 4)`},
		stream: []string{`update float_key set v = 9 where f = 0`, `update float_key set f = 'Infinity' where f = 'NaN'`, `delete from float_key where f = 0.1`}},
	{name: "interval_key", key: "i",
		create: []string{`create table interval_key (i interval primary key, v int)`,
			`insert into interval_key values ('1 mon', 1), ('1 year -2 mons 3 days -04:05:06.789', 2)`},
		stream: []string{`update interval_key set v = 9 where i = '30 days'`, `update interval_key set i = '-178000000 years' where v = 2`}},
	{name: "bytea_key", key: "b",
		create: []string{`create table bytea_key (b bytea primary key, v int)`, `insert into bytea_key values ('\x00', 1), ('\x', 2), ('\x5c', 3)`},
		stream: []string{`update bytea_key set b = '\x0000' where v = 1`, `delete from bytea_key where v = 2`}},
	// A key of a user enum (sorted by its label order, not alphabetically) and a domain.
	{name: "user_type_key", key: "m, d", user: true,
		create: []string{`create type sortmood as enum ('z', 'a')`, `create domain nonbad as text check (value <> 'bad')`,
			`create table user_type_key (m sortmood, d nonbad, v int, primary key (m, d))`,
			`insert into user_type_key values ('z', 'x', 1), ('a', 'x', 2), ('a', 'y', 3)`},
		stream: []string{`update user_type_key set m = 'z' where v = 3`, `insert into user_type_key values ('a', 'q', 4)`, `delete from user_type_key where v = 1`}},
	// A dropped column is not sent by pgoutput and not created on the target.
	{name: "dropped_column", key: "id",
		create: []string{`create table dropped_column (id int primary key, gone text, v text)`, `alter table dropped_column drop column gone`,
			`insert into dropped_column values (1, 'a'), (2, 'b')`},
		stream: []string{`update dropped_column set v = 'c' where id = 1`, `insert into dropped_column values (3, 'd')`}},
}

// TestKeyShapes: each replica identity and key shape converges on both paths, including updates
// that change the key, and the target table gets the replica identity key as its primary key.
func TestKeyShapes(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	oddDatabaseDefaults(t, env)
	src, tgt := connectRendering(t, env.SourceURL), connectRendering(t, env.TargetURL)
	for _, s := range keyShapes {
		pgtest.Exec(t, src, s.create...)
	}
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	for _, s := range keyShapes {
		pgtest.Exec(t, src, s.stream...)
	}
	pgtest.WaitSlotCaughtUp(t, env)
	for _, s := range keyShapes {
		t.Run(s.name, func(t *testing.T) {
			requireSameRows(t, src, tgt, s.name, s.key, !s.user)
			key := pgtest.Scalar[string](t, tgt, `select string_agg(quote_ident(a.attname), ', ' order by k.i)
from pg_index x, unnest(x.indkey[0:x.indnkeyatts-1]) with ordinality k(attnum, i), pg_attribute a
where x.indrelid = $1::regclass and x.indisprimary and a.attrelid = x.indrelid and a.attnum = k.attnum`, s.name)
			if key != s.key {
				t.Errorf("target primary key (%s), want (%s)", key, s.key)
			}
		})
	}
}

// A partitioned table without a key is refused, naming it and the fix, before anything is
// created (a table without a key is replicated by whole rows with REPLICA IDENTITY FULL,
// keyless_test.go, and kept by snapshots without it, snapshotonly_test.go; not yet when
// partitioned).
func TestPartitionedTableWithoutKeyIsRefused(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table parted (x int, y text) partition by range (x)`,
		`create table parted_a partition of parted for values from (0) to (10)`,
		`alter table parted replica identity full`, `alter table parted_a replica identity full`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.parted"}
	requireRefusal(t, cfg, "public.parted is partitioned and has no primary key", "ADD PRIMARY KEY")
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where slot_name = $1`, env.Name); n != 0 {
		t.Errorf("a refused run left a slot")
	}
}
