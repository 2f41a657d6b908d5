package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// slotConfirmedPast reports whether env's slot's confirmed_flush_lsn is at or past lsn.
func slotConfirmedPast(t *testing.T, env *pgtest.Env, lsn string) bool {
	t.Helper()
	return pgtest.Scalar[bool](t, env.Source, `select confirmed_flush_lsn >= $2::pg_lsn from pg_replication_slots where slot_name = $1`, env.Name, lsn)
}

// addColumnBeforeTheSlot adds column d with a default to streamed table t on the source (a change
// no Relation message shows until t's next change) and waits until the slot is confirmed past
// it, failing the test if it was while the target table lacked the column.
func addColumnBeforeTheSlot(t *testing.T, env *pgtest.Env) {
	t.Helper()
	pgtest.Exec(t, env.Source, `alter table t add column d int default 7`)
	at := pgtest.Scalar[string](t, env.Source, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Eventually(t, 60*time.Second, "confirmed_flush_lsn past the ADD COLUMN", func() (bool, string) {
		if !slotConfirmedPast(t, env, at) {
			return false, "not yet"
		}
		if n := pgtest.Scalar[int](t, env.Target, `select count(*)::int from pg_attribute where attrelid = 't'::regclass and attname = 'd'`); n != 1 {
			t.Fatalf("confirmed_flush_lsn passed the ADD COLUMN at %s while the target table lacks column d", at)
		}
		return true, ""
	})
}

// The catalog watcher's probes vouch for the slot between its full checks: with full checks an
// hour apart, the slot is still confirmed past what the target committed, and a column added on
// the source (which changes the probed catalog rows) is still found before the slot passes it.
func TestSlotIsConfirmedByProbesBetweenFullChecks(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key, v text, n int)`,
		`insert into t select g, 'v' || g, g from generate_series(1, 50) g`)
	cfg := testConfig(t, env)
	cfg.Knobs.FullCheckEvery = time.Hour
	var probes atomic.Int64
	cfg.Knobs.AfterCatalogCheck = func(full bool) {
		if !full {
			probes.Add(1)
		}
	}
	d := startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `update t set n = n + 1 where id <= 10`)
	at := pgtest.Scalar[string](t, env.Source, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Eventually(t, 60*time.Second, "confirmed_flush_lsn past the update", func() (bool, string) {
		return slotConfirmedPast(t, env, at), "not yet"
	})
	if probes.Load() == 0 {
		t.Fatal("the slot was confirmed without a probe: the test does not test probes")
	}
	addColumnBeforeTheSlot(t, env)
	pgtest.WaitConverged(t, env, "t", "id")
	d.RequireRunning(t)
}

// A catalog change whose commit waits for a synchronous standby is in the WAL, and decoded, but
// not visible to any catalog check until the standby confirms. The slot is not confirmed past it
// meanwhile, however long that takes and however many checks find the catalog unchanged; once
// the commit completes the change is found (the table left the publication, and so the default
// selection) and the slot moves on. Serial: it sets synchronous_standby_names on the source
// cluster.
func TestSlotIsNotConfirmedPastACommitWaitingForAStandby(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key, v text)`, `create table u (id int primary key, v text)`,
		`insert into t select g, 'v' from generate_series(1, 20) g`)
	cfg := testConfig(t, env)
	var full atomic.Int64
	cfg.Knobs.AfterCatalogCheck = func(f bool) {
		if f {
			full.Add(1)
		}
	}
	d := startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.WaitSlotCaughtUp(t, env)

	admin := pgtest.Connect(t, env.SourceURL)
	pgtest.Exec(t, admin, `alter system set synchronous_standby_names = 'pgconverge_test_no_such_standby'`, `select pg_reload_conf()`)
	reset := func() {
		pgtest.Exec(t, pgtest.Connect(t, env.SourceURL), `alter system reset synchronous_standby_names`, `select pg_reload_conf()`)
	}
	t.Cleanup(reset)
	hung := pgtest.Connect(t, env.SourceURL)
	pgtest.Exec(t, hung, `set synchronous_commit = on`)
	pgtest.Eventually(t, 30*time.Second, "synchronous_standby_names in effect", func() (bool, string) {
		v := pgtest.Scalar[string](t, hung, `select current_setting('synchronous_standby_names')`)
		return v != "", v
	})
	done := make(chan error, 1)
	go func() {
		_, err := hung.Exec(context.Background(), `alter publication `+pgx.Identifier{cfg.Publication}.Sanitize()+` drop table t`)
		done <- err
	}()
	pgtest.Eventually(t, 30*time.Second, "the ALTER PUBLICATION waiting for the standby", func() (bool, string) {
		n := pgtest.Scalar[int](t, admin, `select count(*)::int from pg_stat_activity where wait_event = 'SyncRep'`)
		return n == 1, "not yet"
	})
	// Later changes (their commits wait for no standby: synchronous_commit is off) are streamed.
	pgtest.Exec(t, env.Source, `insert into u select g, 'after' from generate_series(1, 10) g`)
	after := pgtest.Scalar[string](t, env.Source, `select pg_current_wal_insert_lsn()::text`)
	pgtest.WaitConverged(t, env, "u", "id")
	checked := full.Load()
	pgtest.Eventually(t, 60*time.Second, "two full catalog checks after the stream applied the later changes", func() (bool, string) {
		return full.Load() >= checked+2, "not yet"
	})
	if slotConfirmedPast(t, env, after) {
		t.Fatalf("the slot was confirmed past %s while the ALTER PUBLICATION before it waited for a standby, unseen by the catalog checks", after)
	}
	reset()
	if err := <-done; err != nil {
		t.Fatalf("ALTER PUBLICATION: %v", err)
	}
	// The table left the publication; added again, it is loaded again and followed.
	pgtest.Exec(t, env.Source, `update t set v = 'w' where id <= 5`,
		`alter publication `+pgx.Identifier{cfg.Publication}.Sanitize()+` add table t`, `update t set v = 'x' where id = 6`)
	pgtest.WaitConverged(t, env, "t", "id")
	pgtest.WaitConverged(t, env, "u", "id")
	pgtest.Eventually(t, 60*time.Second, "the slot confirmed past the later changes", func() (bool, string) {
		return slotConfirmedPast(t, env, after), "not yet"
	})
	d.RequireRunning(t)
}
