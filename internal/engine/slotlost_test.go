package engine_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// invalidateSlot makes the source invalidate the test's slot: a 1 MB max_slot_wal_keep_size (reset
// at cleanup), then WAL written, switched and checkpointed until its wal_status is lost.
func invalidateSlot(t *testing.T, env *pgtest.Env) {
	t.Helper()
	pgtest.Exec(t, env.Source, `create table if not exists slot_noise (v text)`,
		`alter system set max_slot_wal_keep_size = '1MB'`, `select pg_reload_conf()`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Connect(t, env.SourceURL), `alter system reset max_slot_wal_keep_size`, `select pg_reload_conf()`)
	})
	pgtest.Eventually(t, 60*time.Second, "slot invalidated", func() (bool, string) {
		pgtest.Exec(t, env.Source, `insert into slot_noise select repeat('x', 1000) from generate_series(1, 2000)`,
			`select pg_switch_wal()`, `checkpoint`)
		st := pgtest.Scalar[string](t, env.Source, `select coalesce(wal_status, '') from pg_replication_slots where slot_name = $1`, env.Name)
		return st == "lost", "wal_status " + st
	})
}

// A slot the source invalidates while the first load runs from its exported snapshot is a lost
// slot like one found lost at the start: the load's rows stay, the daemon creates the slot again,
// backfills what the lost one did not stream and streams on (it exited on START_REPLICATION's
// 55000 "cannot read from logical replication slot", and so did every later run).
func TestSlotLostDuringTheInitialLoad(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`,
		`insert into a select g, 'v' from generate_series(1, 5000) g`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.a"}
	reached, release := holdLoad(&cfg, "public.a")
	d := startDaemon(t, cfg)
	<-reached
	pgtest.Exec(t, env.Source, `update a set v = 'during the load' where id <= 100`, `delete from a where id > 4990`)
	invalidateSlot(t, env)
	close(release)
	pgtest.Exec(t, env.Source, `alter system reset max_slot_wal_keep_size`, `select pg_reload_conf()`)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `insert into a values (6000, 'after')`)
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	d.RequireRunning(t)
	if r := pgtest.Scalar[string](t, env.Target, `select end_reason from pgconverge.stream_segments where end_lsn is not null`); !strings.Contains(r, "wal_status lost") {
		t.Errorf("ended segment's reason %q does not say the slot was invalidated", r)
	}
}

// A slot the source invalidates while the daemon streams it (the stream stalled behind a busy
// target while the source wrote more than max_slot_wal_keep_size) is replaced too: the changes the
// lost slot did not deliver arrive by the gap backfill.
func TestSlotLostWhileStreaming(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `insert into a values (1, 'before')`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.a"}
	var stalled atomic.Bool
	gate := make(chan struct{})
	cfg.Knobs.Stream.OnGroup = func(int, bool) {
		if stalled.Load() {
			<-gate
		}
	}
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	stalled.Store(true)
	pgtest.Exec(t, env.Source, `insert into a values (2, 'stalled')`, `update a set v = 'changed' where id = 1`)
	invalidateSlot(t, env)
	pgtest.Exec(t, env.Source, `insert into a values (3, 'while lost')`)
	stalled.Store(false)
	close(gate)
	pgtest.Exec(t, env.Source, `alter system reset max_slot_wal_keep_size`, `select pg_reload_conf()`)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `insert into a values (4, 'after')`)
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	d.RequireRunning(t)
}

// A slot PostgreSQL 18 invalidates for lying idle past idle_replication_slot_timeout (its
// invalidation_reason idle_timeout) is a lost slot like one that lost its WAL: coverage shows the
// gap and names the reason, the restarted daemon replaces the slot, backfills the gap and says
// why its old segment ended. Serial: the timeout is a setting of the whole source cluster (reset at
// cleanup), which would invalidate any other test's idle slot at a checkpoint.
func TestIdleTimedOutSlotIsAGap(t *testing.T) {
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 18, "idle_replication_slot_timeout")
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`,
		`insert into a select g, 'v' from generate_series(1, 1000) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitSlotCaughtUp(t, env)
	waitCovered(t, env)
	d.Stop(t)
	from := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Exec(t, env.Source, `update a set v = 'while idle' where id <= 500`, `delete from a where id > 990`)
	pgtest.Exec(t, env.Source, `alter system set idle_replication_slot_timeout = '1s'`, `select pg_reload_conf()`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Connect(t, env.SourceURL), `alter system reset idle_replication_slot_timeout`, `select pg_reload_conf()`)
	})
	pgtest.Eventually(t, 60*time.Second, "slot invalidated for idling", func() (bool, string) {
		pgtest.Exec(t, env.Source, `checkpoint`)
		r := pgtest.Scalar[string](t, env.Source, `select coalesce(invalidation_reason, '') from pg_replication_slots where slot_name = $1`, env.Name)
		return r == "idle_timeout", "invalidation_reason " + r
	})
	pgtest.Exec(t, env.Source, `alter system reset idle_replication_slot_timeout`, `select pg_reload_conf()`)
	to := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	rep, code := coverageOf(t, env)
	if code != exitGap || len(rep.Slots) != 1 || rep.Slots[0].InvalidationReason != "idle_timeout" || !strings.Contains(rep.Slots[0].Warning, "idle_timeout") {
		t.Fatalf("exit %d, slots %+v: want exit 3 and a slot invalidated for idle_timeout, named in the warning", code, rep.Slots)
	}
	requireGapCovers(t, rep, "public.a", coverage.GapStatus, from, to)

	requireSlotReplaced(t, env, "idle_timeout")
}
