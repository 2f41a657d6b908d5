package engine_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// TestPromotedStandbyContinuesTheFailoverSlot streams from the source with a failover slot and a
// physical standby that syncs it (PostgreSQL 17 docs §29.3 "Logical Replication Failover": on the
// source synchronized_standby_slots names the standby's physical slot; on the standby
// sync_replication_slots, hot_standby_feedback, primary_slot_name and dbname in
// primary_conninfo), waits until the standby's copy of the slot is ready for failover and has
// confirmed as far as the target's progress, stops the daemon, promotes the standby, writes on
// it, and points the daemon at it: it continues from the synced slot, with no new slot, no
// backfill and the same open stream segment, and the target converges.
//
// The old primary is not killed: it is the source cluster every other test shares. Stopping the
// daemon before the promotion stands in for the primary's death, since the daemon can then
// receive nothing the standby lacks either way (synchronized_standby_slots already holds the
// slot's changes back until the standby has them); what is tested is what the daemon does with
// the promoted server. The test is serial: it sets synchronized_standby_slots on the shared
// source (ALTER SYSTEM) and owns the one standby.
func TestPromotedStandbyContinuesTheFailoverSlot(t *testing.T) {
	env := pgtest.New(t)
	ctx := context.Background()
	if v := pgsession.MajorVersion(env.Source.PgConn()); v < 17 {
		t.Skipf("failover slots need PostgreSQL 17 or later; the source runs %d", v)
	}
	sb := pgtest.NewStandby(t, "failover_standby")
	admin := pgtest.Connect(t, strings.Replace(env.SourceURL, "/"+env.Name, "/postgres", 1))
	pgtest.Exec(t, admin, "alter system set synchronized_standby_slots = '"+sb.Slot+"'", "select pg_reload_conf()")
	// Cleanups run last in, first out: the setting is reset before the standby stops, so that no
	// failover slot of the source waits for a standby that is gone.
	t.Cleanup(func() {
		pgtest.Exec(t, admin, "alter system reset synchronized_standby_slots", "select pg_reload_conf()")
	})

	pgtest.Exec(t, env.Source,
		"create table items (id int primary key, v text)",
		"insert into items select g, 'loaded ' || g from generate_series(1, 500) g")
	cfg := testConfig(t, env)
	cfg.FailoverSlot = true
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "items", "id")
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source,
		"insert into items select g, 'streamed ' || g from generate_series(501, 800) g",
		"update items set v = 'updated' where id % 7 = 0",
		"delete from items where id % 11 = 0")
	pgtest.WaitConverged(t, env, "items", "id")
	if !pgtest.Scalar[bool](t, env.Source, `select failover from pg_replication_slots where slot_name = $1`, env.Name) {
		t.Fatal("the daemon's slot is not a failover slot")
	}
	// The daemon confirms the target's progress to the slot; the standby's slot sync worker copies
	// the slot's position within its naptime (up to 30 s when nothing changes).
	progress := pgtest.Scalar[string](t, env.Target, `select applied_lsn::text from pgconverge.progress where slot = $1`, env.Name)
	standby := pgtest.Connect(t, sb.AdminURL)
	began := time.Now()
	pgtest.Eventually(t, 2*time.Minute, "the standby's copy of the slot ready for failover at "+progress, func() (bool, string) {
		var ready, caught bool
		var flush *string
		err := standby.QueryRow(ctx, `select synced and not temporary and invalidation_reason is null, confirmed_flush_lsn >= $2::pg_lsn, confirmed_flush_lsn::text
from pg_replication_slots where slot_name = $1`, env.Name, progress).Scan(&ready, &caught, &flush)
		if err != nil {
			return false, err.Error()
		}
		return ready && caught, fmt.Sprintf("ready %v, confirmed_flush_lsn %v", ready, flush)
	})
	t.Logf("the standby's copy of the slot was ready at the target's progress %s %s after the target reached it", progress, time.Since(began).Round(time.Millisecond))
	rep, err := operator.CoverageReport(ctx, operator.CoverageConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: env.Name, Standbys: []string{sb.AdminURL}})
	if err != nil {
		t.Fatal(err)
	}
	requireFailoverReady(t, rep, env.Name, sb.Slot)

	d.Stop(t)
	before := takeStreamState(t, env)
	sb.Promote(t)
	promoted := *env
	promoted.SourceURL = sb.URL(t, env.Name)
	promoted.Source = pgtest.Connect(t, promoted.SourceURL)
	pgtest.Exec(t, promoted.Source,
		"insert into items select g, 'after the failover ' || g from generate_series(801, 1000) g",
		"update items set v = 'updated after the failover' where id % 13 = 0",
		"delete from items where id % 17 = 0")
	var log pgtest.SyncBuffer
	cfg.Source = promoted.SourceURL
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&log, pgtest.LogWriter(t)), &slog.HandlerOptions{Level: slog.LevelInfo}))
	began = time.Now()
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, &promoted, "items", "id")
	t.Logf("the daemon pointed at the promoted standby converged %s after it started", time.Since(began).Round(time.Millisecond))

	if !strings.Contains(log.String(), "the source is on a new timeline") {
		t.Errorf("the daemon did not log that it checked the new timeline:\n%s", log.String())
	}
	requireSlotContinued(t, env, promoted.SourceURL, before, log.String())
}

// TestStandbyPromotedBehindTheTargetIsRefused promotes a standby that stopped receiving WAL
// before the changes the target then applied (no synchronized_standby_slots holds them back), and
// writes on it past the target's progress, so that its current WAL position alone cannot tell: the
// daemon pointed at it refuses, from its timeline history, to stream (the target holds changes
// the new primary never had, at LSNs it reuses). The source cluster is not killed, as in
// TestPromotedStandbyContinuesTheFailoverSlot; the test is serial, as it owns the one standby.
func TestStandbyPromotedBehindTheTargetIsRefused(t *testing.T) {
	env := pgtest.New(t)
	if v := pgsession.MajorVersion(env.Source.PgConn()); v < 15 {
		t.Skipf("the test's standby needs PostgreSQL 15 or later (pg_backup_start); the source runs %d", v)
	}
	sb := pgtest.NewStandby(t, "diverged_standby")
	pgtest.Exec(t, env.Source, "create table items (id int primary key, v text)",
		"insert into items select g, 'loaded' from generate_series(1, 100) g")
	cfg := testConfig(t, env)
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "items", "id")
	pgtest.WaitStreaming(t, env)
	pgtest.WaitSlotCaughtUp(t, env)
	// Cut the standby off (its WAL receiver stops once primary_conninfo is empty), as a network
	// partition or a lagging asynchronous standby would.
	standby := pgtest.Connect(t, sb.AdminURL)
	pgtest.Exec(t, standby, "alter system set primary_conninfo = ''", "select pg_reload_conf()")
	pgtest.Eventually(t, 30*time.Second, "the standby's WAL receiver stopped", func() (bool, string) {
		n := pgtest.Scalar[int64](t, standby, `select count(*) from pg_stat_wal_receiver`)
		return n == 0, fmt.Sprintf("%d WAL receivers", n)
	})
	received := pgtest.Scalar[string](t, standby, `select pg_last_wal_receive_lsn()::text`)
	pgtest.Exec(t, env.Source, "insert into items select g, 'the standby never gets this' from generate_series(101, 300) g")
	pgtest.WaitConverged(t, env, "items", "id")
	d.Stop(t)
	progress := pgtest.Scalar[string](t, env.Target, `select applied_lsn::text from pgconverge.progress where slot = $1`, env.Name)
	if !pgtest.Scalar[bool](t, env.Target, `select $1::pg_lsn > $2::pg_lsn`, progress, received) {
		t.Fatalf("the target's progress %s is not past what the standby received, %s", progress, received)
	}

	sb.Promote(t)
	promoted := pgtest.Connect(t, sb.URL(t, env.Name))
	pgtest.Eventually(t, time.Minute, "the promoted server's WAL position passes the target's progress "+progress, func() (bool, string) {
		pgtest.Exec(t, promoted, "insert into items select max(id) + 1, 'written on the promoted server' from items", "select pg_switch_wal()")
		now := pgtest.Scalar[string](t, promoted, `select pg_current_wal_insert_lsn()::text`)
		return pgtest.Scalar[bool](t, promoted, `select $1::pg_lsn > $2::pg_lsn`, now, progress), now
	})
	cfg.Source = sb.URL(t, env.Name)
	requireRefusal(t, cfg, "promoted standby that left timeline 1", "before the target's progress "+progress, "synchronized_standby_slots")
}

// requireFailoverReady requires the coverage report to show slot as a failover slot whose copy
// on the one standby checked is ready, with physical slot active and named in
// synchronized_standby_slots, and no warning.
func requireFailoverReady(t *testing.T, rep coverage.Report, slot, physical string) {
	t.Helper()
	for _, s := range rep.Slots {
		if s.Name != slot {
			continue
		}
		f := s.Failover
		switch {
		case f == nil:
			t.Fatalf("slot %s: no failover readiness reported", slot)
		case !f.Enabled || !f.Ready || len(f.Warnings) != 0 || len(f.StandbyChecks) != 1:
			t.Fatalf("slot %s: failover %+v, want enabled and ready on the one standby, without warnings", slot, *f)
		}
		for _, p := range f.PhysicalSlots {
			if p.Name == physical && p.Active && p.Synchronized {
				return
			}
		}
		t.Fatalf("slot %s: physical slot %s not reported active, synchronized and with feedback: %+v", slot, physical, f.PhysicalSlots)
	}
	t.Fatalf("slot %s not in the report", slot)
}

// A source that is a standby in recovery is refused at start, naming it and the fix, before
// anything is written (decoding from a standby is not supported yet). Serial: one standby at a
// time.
func TestStandbySourceIsRefused(t *testing.T) {
	env := pgtest.New(t)
	if v := pgsession.MajorVersion(env.Source.PgConn()); v != 15 {
		t.Skipf("a standby source is refused on PostgreSQL 15 (14 cannot make the test's standby: pg_backup_start; 16 and later decode on a standby, TestStandbySourceConverges); the source runs %d", v)
	}
	pgtest.Exec(t, env.Source, "create table items (id int primary key, v text)")
	sb := pgtest.NewStandby(t, "source_standby")
	cfg := testConfig(t, env)
	cfg.Source = sb.URL(t, env.Name)
	requireRefusal(t, cfg, "is a standby in recovery", "decoding from a standby needs PostgreSQL 16 or later", "point --source at the primary")
	if n := pgtest.Scalar[int](t, env.Target, `select count(*) from pg_namespace where nspname = 'pgconverge'`); n != 0 {
		t.Errorf("the refused run created the pgconverge schema on the target")
	}
}

// streamState is what a daemon that continues its slot must leave unchanged: the backfills
// recorded and the slot's stream segments.
type streamState struct {
	backfills int64
	segments  []string
}

// takeStreamState reads the test slot's streamState from the target.
func takeStreamState(t *testing.T, env *pgtest.Env) streamState {
	t.Helper()
	return streamState{
		backfills: pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfills`),
		segments:  pgtest.Rows(t, env.Target, `select id || ' ' || start_lsn || ' ' || coalesce(end_lsn::text, 'open') from pgconverge.stream_segments where slot = '`+env.Name+`'`),
	}
}

// requireSlotContinued requires that a daemon pointed at the promoted standby sourceURL continued
// the slot: no backfill since before, the same stream segments, no slot created (log is the
// daemon's log since it started), and coverage without a gap.
func requireSlotContinued(t *testing.T, env *pgtest.Env, sourceURL string, before streamState, log string) {
	t.Helper()
	after := takeStreamState(t, env)
	if after.backfills != before.backfills {
		t.Errorf("backfills after the promotion: %d, want %d (no reload)", after.backfills, before.backfills)
	}
	if d := pgtest.Diff(before.segments, after.segments); d != "" {
		t.Errorf("stream segments changed across the promotion: %s (before %v, after %v)", d, before.segments, after.segments)
	}
	if strings.Contains(log, "creating replication slot") {
		t.Errorf("the daemon created a slot on the promoted standby:\n%s", log)
	}
	rep, err := operator.CoverageReport(t.Context(), operator.CoverageConfig{Source: sourceURL, Target: env.TargetURL, Slot: env.Name})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range rep.Tables {
		if tr.Status != coverage.Covered || len(tr.Gaps) != 0 {
			t.Errorf("after the promotion %s is %s with gaps %v, want covered without gaps", tr.Table, tr.Status, tr.Gaps)
		}
	}
}
