package engine_test

import (
	"testing"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// An update that changes the key while a TOASTed column stays unchanged moves the old key's
// value to the new key: never NULL, never the value of an earlier row with the new key.
func TestKeyChangeCarriesUnchangedToastValue(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table docs (id int primary key, n int, body text)`,
		`alter table docs alter column body set storage external`,
		`insert into docs select g, 0, repeat(md5(g::text), 100) from generate_series(1, 10) g`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "docs", "id")
	pgtest.Exec(t, env.Source,
		`update docs set id = id + 100 where id in (1, 2)`,
		// swap keys 3, 4 and 5 in one transaction
		`begin; update docs set id = -3 where id = 3; update docs set id = 3 where id = 4;
		 update docs set id = 4 where id = 5; update docs set id = 5 where id = -3; commit`,
		`begin; insert into docs values (60, 0, repeat('x', 5000)); update docs set id = 61 where id = 60; commit`,
		// a key that existed before: the moved row must not inherit the old row of key 7
		`delete from docs where id = 7`,
		`update docs set id = 7 where id = 8`)
	pgtest.WaitConverged(t, env, "docs", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from docs where not _cdc_deleted and (body is null or _cdc_unknown is not null)`); n != 0 {
		t.Errorf("%d live target rows lack their TOASTed value", n)
	}
}

// Keys equal by their type's equality but spelled differently are one key, not two.
func TestNumericKeyRespelled(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table nk (id numeric primary key, v int)`, `insert into nk values (1.0, 1), (2, 2)`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "nk", "id")
	pgtest.Exec(t, env.Source, `update nk set id = 1.00, v = 10 where id = 1`, `update nk set v = 3 where id = 2`)
	pgtest.WaitConverged(t, env, "nk", "id")
}

// A load from a new snapshot removes target rows the source deleted while nothing streamed them
// (here: the slot was dropped, and the daemon's gap backfill reloads the table).
func TestReloadRemovesRowsGoneFromTheSource(t *testing.T) {
	t.Parallel()
	env := loadedAndStopped(t)
	dropSlot(t, env)
	pgtest.Exec(t, env.Source, `delete from a where id > 90`, `update a set v = 'changed' where id = 1`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from a where _cdc_deleted`); n != 10 {
		t.Errorf("%d tombstones, want the 10 rows deleted while nothing streamed", n)
	}
}
