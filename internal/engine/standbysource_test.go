package engine_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/internal/verify"
)

// TestStandbySourceConverges decodes from a hot standby (PostgreSQL 16 and later): the publication
// is made on the primary (--primary), the slot and every exact snapshot on the standby. The daemon
// loads and streams a workload committed on the primary, is killed (SIGKILL) mid-transaction and
// continues the slot after a restart; a backfill and a verify read exact snapshots on the standby;
// after the standby is promoted the daemon continues the same slot with no gap and no reload.
func TestStandbySourceConverges(t *testing.T) {
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 16, "logical decoding on a standby")
	setupCrashTables(t, env)
	pgtest.Exec(t, env.Source, "create table docs (id int primary key, body text)",
		"insert into docs select g, repeat(md5(g::text), 400) from generate_series(1, 200) g")
	sb := pgtest.NewStandby(t, "decoding_standby")
	standbyURL := sb.URL(t, env.Name)

	stopWorkload := workload(t, env)
	child := crashChildCmd(env, "mid-transaction", 15)
	child.Env = append(child.Env, envCrashSrc+"="+standbyURL, envCrashPrimary+"="+env.SourceURL) // the last value of a key wins
	out, err := child.CombinedOutput()
	requireKilled(t, err, out)
	var log pgtest.SyncBuffer
	cfg := testConfig(t, env)
	cfg.Source, cfg.Primary = standbyURL, env.SourceURL
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&log, pgtest.LogWriter(t)), &slog.HandlerOptions{Level: slog.LevelInfo}))
	restartedAt := pgtest.Scalar[int64](t, env.Source, `select coalesce(max(txn), 0) from ledger`)
	d := startDaemon(t, cfg)
	pgtest.Eventually(t, 60*time.Second, "restarted daemon streams live changes from the standby", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select coalesce(max(txn), 0) from ledger`)
		return n > restartedAt+20, fmt.Sprintf("target at transaction %d, restarted at %d", n, restartedAt)
	})
	pgtest.Exec(t, env.Source, "update docs set body = body || 'x' where id % 3 = 0", "delete from docs where id % 10 = 0")
	stopWorkload()
	for _, table := range []string{"acct", "ledger", "docs"} {
		pgtest.WaitConverged(t, env, table, "id")
	}
	standby := pgtest.Connect(t, standbyURL)
	if n := pgtest.Scalar[int](t, standby, `select count(*) from pg_replication_slots where slot_name = $1 and slot_type = 'logical'`, env.Name); n != 1 {
		t.Fatalf("the standby has %d logical slots named %s, want 1", n, env.Name)
	}
	if n := pgtest.Scalar[int](t, env.Source, `select count(*) from pg_replication_slots where slot_name = $1`, env.Name); n != 0 {
		t.Fatalf("the primary has a slot named %s: the daemon decoded from the primary", env.Name)
	}
	if n := pgtest.Scalar[int](t, env.Source, `select count(*) from pg_publication where pubname = $1`, env.Name); n != 1 {
		t.Fatalf("the primary has no publication %s", env.Name)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.stream_segments where end_lsn is not null`); n != 0 {
		t.Errorf("%d stream segments ended although the kill kept the slot, want 0", n)
	}

	// A backfill and a verify each read a temporary slot's exact snapshot on the standby.
	pgtest.Exec(t, env.Source, "update acct set bal = bal + 1 where id % 5 = 0")
	rep, err := operator.Backfill(t.Context(), operator.BackfillConfig{Source: cfg.Source, Primary: cfg.Primary, Target: env.TargetURL,
		Tables: []string{"public.acct"}, Workers: 2, ChunkRows: 1000, Logger: cfg.Logger})
	if err != nil {
		t.Fatalf("backfill from the standby: %v", err)
	}
	if rep.Rows != 2000 {
		t.Errorf("backfill from the standby read %d rows, want 2000", rep.Rows)
	}
	pgtest.WaitConverged(t, env, "acct", "id")
	vrep, err := verify.Run(t.Context(), verify.Config{Source: cfg.Source, Primary: cfg.Primary, Target: env.TargetURL, Logger: cfg.Logger})
	if err != nil {
		t.Fatalf("verify from the standby: %v", err)
	}
	if vrep.Found != 0 || len(vrep.Tables) != 3 {
		t.Fatalf("verify from the standby compared %d tables and found %d discrepancies, want 3 and 0: %+v", len(vrep.Tables), vrep.Found, vrep.Tables)
	}

	d.Stop(t)
	before := takeStreamState(t, env)
	sb.Promote(t)
	promoted := *env
	promoted.SourceURL = standbyURL
	promoted.Source = pgtest.Connect(t, standbyURL)
	pgtest.Exec(t, promoted.Source,
		"insert into ledger (txn, k) select -1, g from generate_series(1, 300) g",
		"update acct set bal = bal - 1 where id % 13 = 0",
		"delete from docs where id % 7 = 0")
	mark := len(log.String())
	startDaemon(t, cfg)
	for _, table := range []string{"acct", "ledger", "docs"} {
		pgtest.WaitConverged(t, &promoted, table, "id")
	}
	requireSlotContinued(t, env, promoted.SourceURL, before, log.String()[mark:])
}

// TestStandbySourceWithoutPrimary runs the daemon on a standby without --primary: it refuses a
// publication that lacks a table, naming the statement to run on the primary, and a --primary
// that is another cluster; with the publication made on the primary, it warns what slot creations
// wait for and converges while the operator logs the standby snapshots on the primary, as the
// warning says.
func TestStandbySourceWithoutPrimary(t *testing.T) {
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 16, "logical decoding on a standby")
	pgtest.Exec(t, env.Source,
		"create table items (id int primary key, v text)",
		"insert into items select g, 'loaded ' || g from generate_series(1, 1000) g")
	sb := pgtest.NewStandby(t, "decoding_standby")
	var log pgtest.SyncBuffer
	cfg := testConfig(t, env)
	cfg.Source = sb.URL(t, env.Name)
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&log, pgtest.LogWriter(t)), &slog.HandlerOptions{Level: slog.LevelInfo}))
	requireRefusal(t, cfg, "the source is read-only (a standby): run on its primary: create publication "+pgx.Identifier{env.Name}.Sanitize()+` for table "public"."items"`, "or pass --primary")
	wrong := cfg
	wrong.Primary = env.TargetURL
	requireRefusal(t, wrong, "--primary at", "name the primary of that standby")

	pgtest.Exec(t, env.Source, "create publication "+env.Name+" for table items")
	standby := pgtest.Connect(t, cfg.Source)
	pgtest.Eventually(t, 30*time.Second, "the standby replays the publication", func() (bool, string) {
		return pgtest.Scalar[bool](t, standby, `select exists (select 1 from pg_publication where pubname = $1)`, env.Name), "not yet"
	})
	// What the warning tells the operator to run while the daemon waits for a slot, every 0.5 s.
	ctx, cancel := context.WithCancel(t.Context())
	logged := make(chan error, 1)
	primary := pgtest.Connect(t, env.SourceURL)
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := primary.Exec(ctx, `select pg_log_standby_snapshot()`); err != nil {
				logged <- err
				return
			}
			select {
			case <-ctx.Done():
				logged <- nil
				return
			case <-tick.C:
			}
		}
	}()
	defer func() {
		cancel()
		if err := <-logged; err != nil && ctx.Err() == nil {
			t.Errorf("pg_log_standby_snapshot on the primary: %v", err)
		}
	}()
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "items", "id")
	pgtest.Exec(t, env.Source, "update items set v = 'streamed' where id % 3 = 0", "delete from items where id % 5 = 0")
	pgtest.WaitConverged(t, env, "items", "id")
	if !strings.Contains(log.String(), "the source is a standby and --primary is not set") {
		t.Errorf("no warning that --primary is not set:\n%s", log.String())
	}
}

// TestStandbySourceLoadSurvivesARecoveryConflict cancels the initial load's reads on the standby
// source midway, as a standby does when the replay of a lock taken on the primary waits longer
// than max_standby_streaming_delay for them (a conflict with recovery): the daemon retries, the
// load resumes from its last chunk, and the table converges.
func TestStandbySourceLoadSurvivesARecoveryConflict(t *testing.T) {
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 16, "logical decoding on a standby")
	pgtest.Exec(t, env.Source,
		"create table big (id int primary key, v text)",
		"insert into big select g, md5(g::text) from generate_series(1, 100000) g")
	sb := pgtest.NewStandby(t, "decoding_standby")
	pgtest.Exec(t, pgtest.Connect(t, sb.AdminURL), "alter system set max_standby_streaming_delay = '10ms'", "select pg_reload_conf()")
	var log pgtest.SyncBuffer
	cfg := testConfig(t, env)
	cfg.Source, cfg.Primary = sb.URL(t, env.Name), env.SourceURL
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&log, pgtest.LogWriter(t)), &slog.HandlerOptions{Level: slog.LevelInfo}))
	// Once the load runs, the primary takes an ACCESS EXCLUSIVE lock on big again and again for
	// 1.5 s: its replay on the standby cancels the load's readers, which hold a lighter one.
	locks := make(chan error, 1)
	var once sync.Once
	cfg.Knobs.AfterLoadChunk = func(string, int64) {
		once.Do(func() {
			go func() {
				conn, err := pgx.Connect(context.Background(), env.SourceURL)
				if err != nil {
					locks <- err
					return
				}
				defer conn.Close(context.Background())
				for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
					if err := pgx.BeginFunc(context.Background(), conn, func(tx pgx.Tx) error {
						_, err := tx.Exec(context.Background(), "lock table big in access exclusive mode")
						return err
					}); err != nil {
						locks <- err
						return
					}
				}
				locks <- nil
			}()
		})
	}
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "big", "id")
	if err := <-locks; err != nil {
		t.Fatalf("lock big on the primary: %v", err)
	}
	// The standby cancels a running read (40001, with the hint) or ends a session idle in its
	// transaction (the connection closes): either way the session is retried and the load resumes.
	if !strings.Contains(log.String(), "session failed, reconnecting") || !strings.Contains(log.String(), "resuming an interrupted backfill") {
		t.Errorf("the recovery conflict did not interrupt the load, or the load did not resume:\n%s", log.String())
	}
}

// TestCutoverFromAStandbySource cuts over a daemon that decodes on a standby whose replay lags the
// primary (paused): the cutover cuts at the primary's position (--primary; refused without), so it
// waits until the standby has replayed the application's last writes, and the target holds them.
func TestCutoverFromAStandbySource(t *testing.T) {
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 16, "logical decoding on a standby")
	pgtest.Exec(t, env.Source, "create table a (id serial primary key, v text)",
		"insert into a (v) select 'v' || g from generate_series(1, 200) g")
	sb := pgtest.NewStandby(t, "decoding_standby")
	cfg := testConfig(t, env)
	cfg.Source, cfg.Primary = sb.URL(t, env.Name), env.SourceURL
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	// The load is recorded complete: a table still to load would need a new snapshot, whose slot
	// a standby cannot create while its replay is paused.
	onStandby := *env
	onStandby.SourceURL = cfg.Source
	waitCovered(t, &onStandby)
	d.Stop(t)

	noPrimary := cfg
	noPrimary.Primary = ""
	if _, err := operator.Cutover(t.Context(), operator.CutoverConfig{Run: noPrimary}); err == nil || !strings.Contains(err.Error(), "cutover needs --primary") {
		t.Fatalf("cutover from a standby without --primary: %v, want a refusal naming --primary", err)
	}
	standby := pgtest.Connect(t, sb.AdminURL)
	pgtest.Exec(t, standby, "select pg_wal_replay_pause()")
	pgtest.Exec(t, env.Source, "insert into a (v) select 'last write ' || g from generate_series(1, 50) g", "delete from a where id <= 10")
	written := pgtest.Scalar[string](t, env.Source, `select pg_current_wal_insert_lsn()::text`)
	type result struct {
		rep operator.CutoverReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := operator.Cutover(context.Background(), operator.CutoverConfig{Run: cfg})
		done <- result{rep, err}
	}()
	pgtest.Eventually(t, time.Minute, "the cutover streams from the standby", func() (bool, string) {
		return pgtest.Scalar[bool](t, standby, `select coalesce((select active from pg_replication_slots where slot_name = $1), false)`, env.Name), "slot not active"
	})
	select {
	case r := <-done:
		t.Fatalf("the cutover ended while the standby had not replayed the last writes: %+v, %v", r.rep, r.err)
	default:
	}
	pgtest.Exec(t, standby, "select pg_wal_replay_resume()")
	r := <-done
	if r.err != nil {
		t.Fatalf("cutover: %v", r.err)
	}
	if cut, _ := pglogrepl.ParseLSN(r.rep.CutLSN); cut < mustLSN(t, written) || r.rep.VerifiedLSN == "" {
		t.Errorf("cutover report %+v: want cut at or after the last writes at %s, and verified", r.rep, written)
	}
	// The sequence is read on the primary: the target's next value is past every id handed out.
	if len(r.rep.Sequences) != 1 || !pgtest.Scalar[bool](t, env.Target, `select nextval('a_id_seq') > (select max(id) from a)`) {
		t.Errorf("sequences synced by the cutover: %+v; want a_id_seq, past the primary's last id", r.rep.Sequences)
	}
	if d := pgtest.Diff(pgtest.Rows(t, env.Source, `select row(id, v)::text from a order by id`),
		pgtest.Rows(t, env.Target, `select row(id, v)::text from a where not _cdc_deleted order by id`)); d != "" {
		t.Errorf("the target after the cutover differs from the primary:\n%s", d)
	}
}

func mustLSN(t *testing.T, s string) pglogrepl.LSN {
	t.Helper()
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
