package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	. "github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/verify"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// operator.Cutover refuses while a daemon streams; with the daemon stopped and changes it has not seen
// yet, it catches up, verifies and syncs sequences, and retires the tables (coverage exits 0,
// the slot kept when asked); run again with --finalize and --drop-slot it resumes: the slot goes
// and the target tables become plain copies of the source's.
func TestCutover(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id serial primary key, v text)`,
		`insert into a (v) select 'v' || g from generate_series(1, 200) g`,
		`create table k (x int, y text)`, `alter table k replica identity full`,
		`insert into k values (1, 'dup'), (1, 'dup'), (2, 'one')`)
	cfg := testConfig(t, env)
	cfg.LiveSuffix = "_live"
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitStreaming(t, env)
	if _, err := operator.Cutover(context.Background(), operator.CutoverConfig{Run: cfg}); !errors.Is(err, operator.ErrDaemonRunning) {
		t.Fatalf("cutover with the daemon streaming: %v, want ErrDaemonRunning", err)
	}
	d.Stop(t)
	pgtest.Exec(t, env.Source, `delete from a where id <= 20`, `insert into a (v) values ('while stopped')`,
		`update a set v = 'late' where id = 100`, `delete from k where ctid = (select min(ctid) from k where x = 1)`)

	rep, err := operator.Cutover(context.Background(), operator.CutoverConfig{Run: cfg})
	if err != nil {
		t.Fatalf("cutover: %v", err)
	}
	if rep.VerifiedLSN == "" || len(rep.Tables) != 2 || rep.SlotDropped || rep.Resumed {
		t.Errorf("cutover report %+v: want verified, 2 tables, slot kept, not resumed", rep)
	}
	if len(rep.Sequences) != 1 || rep.Sequences[0].Sequence != "public.a_id_seq" {
		t.Errorf("sequences synced: %+v, want public.a_id_seq", rep.Sequences)
	}
	pgtest.WaitConverged(t, env, "a", "id")
	waitSameMultiset(t, env, "k")
	cov, code := coverageOf(t, env)
	if code != 0 || tableReport(t, cov, "public.a").Status != coverage.Retired || tableReport(t, cov, "public.k").Status != coverage.Retired {
		t.Errorf("coverage after cutover: exit %d, %+v; want exit 0 and both tables retired", code, cov.Tables)
	}

	rep, err = operator.Cutover(context.Background(), operator.CutoverConfig{Run: cfg, DropSlot: true, Finalize: true})
	if err != nil {
		t.Fatalf("cutover run again: %v", err)
	}
	if !rep.Resumed || !rep.SlotDropped || len(rep.Finalized) != 2 {
		t.Errorf("cutover run again: %+v; want resumed, slot dropped, 2 tables finalized", rep)
	}
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where slot_name = $1`, env.Name); n != 0 {
		t.Error("the slot still exists after cutover --drop-slot")
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_attribute where attrelid in ('a'::regclass, 'k'::regclass) and attname like '\_cdc\_%' and not attisdropped`); n != 0 {
		t.Errorf("%d _cdc_ columns left after --finalize", n)
	}
	if pgtest.Scalar[bool](t, env.Target, `select to_regnamespace('public_live') is not null`) {
		t.Error("the emptied live view schema public_live is left after --finalize")
	}
	if cov, code := coverageOf(t, env); code != 0 || len(cov.Slots) != 0 {
		t.Errorf("coverage after the cutover: exit %d, slots %+v; want exit 0 and no slot reported", code, cov.Slots)
	}
	if d := pgtest.Diff(pgtest.Rows(t, env.Source, `select row(a.*)::text from a order by id`),
		pgtest.Rows(t, env.Target, `select row(a.*)::text from a order by id`)); d != "" {
		t.Errorf("finalized target a differs from the source:\n%s", d)
	}
	if d := pgtest.Diff(pgtest.Rows(t, env.Source, `select row(k.*)::text from k order by 1`),
		pgtest.Rows(t, env.Target, `select row(k.*)::text from k order by 1`)); d != "" {
		t.Errorf("finalized target k differs from the source:\n%s", d)
	}
	if next := pgtest.Scalar[int64](t, env.Target, `select nextval('a_id_seq')`); next <= 201 {
		t.Errorf("target sequence hands out %d, which the source handed out already", next)
	}
	// A daemon started again (a service enabled at boot) touches nothing of the application's now.
	before := pgtest.Rows(t, env.Target, `select row(a.*)::text from a order by id`)
	requireRefusal(t, cfg, "was cut over into this target", "is not one pgconverge made")
	if d := pgtest.Diff(before, pgtest.Rows(t, env.Target, `select row(a.*)::text from a order by id`)); d != "" {
		t.Errorf("a refused run changed the finalized table:\n%s", d)
	}
}

// A target table of the same name that pgconverge did not make (the application's) is refused,
// with every such table named, and left as it was.
func TestApplicationTableOnTheTargetIsRefused(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `create table k (x int)`,
		`alter table k replica identity full`, `insert into a values (1, 'source')`)
	pgtest.Exec(t, env.Target, `create table a (id int primary key, v text not null default 'x')`, `insert into a values (7, 'mine')`,
		`create table k (x int)`, `insert into k values (1)`)
	requireRefusal(t, testConfig(t, env), "target table public.a exists but is not one pgconverge made", "target table public.k exists but is not one pgconverge made")
	if got := pgtest.Rows(t, env.Target, `select row(a.*)::text from a union all select row(k.*)::text from k`); len(got) != 2 || got[0] != "(7,mine)" {
		t.Errorf("the application's tables changed: %v", got)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_attribute where attname like '\_cdc\_%' and attrelid in ('a'::regclass, 'k'::regclass)`); n != 0 {
		t.Errorf("%d _cdc_ columns added to the application's tables", n)
	}
}

// cutoverCrashChild runs a cutover (with --drop-slot and --finalize) that SIGKILLs itself after
// step; reaching the end is a failure (exit 3).
func cutoverCrashChild(step string) int {
	cfg := operator.CutoverConfig{
		Run: Config{Source: os.Getenv(envCrashSrc), Target: os.Getenv(envCrashTgt), Slot: os.Getenv(envCrashSlot),
			Publication: os.Getenv(envCrashSlot), BackfillWorkers: 2, ChunkRows: 1000, OnGap: OnGapBackfill, LiveSuffix: "_live",
			Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))},
		DropSlot: true, Finalize: true,
		AfterStep: func(s string) {
			if s == step {
				kill()
			}
		},
	}
	_, err := operator.Cutover(context.Background(), cfg)
	fmt.Fprintf(os.Stderr, "cutover child reached the end without crashing after %s: %v\n", step, err)
	return 3
}

// A cutover killed by SIGKILL after each of its steps in turn, and run again each time, ends as
// one that was never interrupted: the tables are plain copies of the source's, the slot is gone,
// and nothing was recorded as cut over before the step that records it.
func TestCutoverKilledAfterEachStepResumes(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id serial primary key, v text)`,
		`insert into a (v) select 'v' || g from generate_series(1, 500) g`,
		`create table p (id int, r text, primary key (id, r)) partition by list (r)`,
		`create table p_x partition of p for values in ('x')`, `create table p_y partition of p for values in ('y')`,
		`insert into p select g, case when g % 2 = 0 then 'x' else 'y' end from generate_series(1, 100) g`)
	cfg := testConfig(t, env)
	cfg.LiveSuffix = "_live"
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	d.Stop(t)
	pgtest.Exec(t, env.Source, `delete from a where id <= 50`, `update p set r = 'x' where id = 1`)
	for _, step := range []string{"caught-up", "verified", "sequences", "recorded", "slot-dropped", "finalized-table"} {
		pgtest.Eventually(t, 30*time.Second, "slot released", func() (bool, string) {
			n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where slot_name = $1 and active`, env.Name)
			return n == 0, "the killed process's walsender still holds the slot"
		})
		out, err := crashChildCmd(env, "cutover:"+step, 0).CombinedOutput()
		requireKilled(t, err, out)
		recorded := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.cutovers`)
		if wantRecorded := step != "caught-up" && step != "verified" && step != "sequences"; (recorded == 1) != wantRecorded {
			t.Fatalf("killed after %s: %d cutovers recorded, want recorded=%v", step, recorded, wantRecorded)
		}
	}
	rep, err := operator.Cutover(context.Background(), operator.CutoverConfig{Run: cfg, DropSlot: true, Finalize: true})
	if err != nil {
		t.Fatalf("cutover run again after the kills: %v", err)
	}
	if !rep.Resumed || !rep.SlotDropped {
		t.Errorf("last cutover: %+v; want resumed with the slot dropped", rep)
	}
	for _, table := range []string{"a", "p"} {
		if d := pgtest.Diff(pgtest.Rows(t, env.Source, `select row(x.*)::text from `+table+` x order by 1`),
			pgtest.Rows(t, env.Target, `select row(x.*)::text from `+table+` x order by 1`)); d != "" {
			t.Errorf("finalized target %s differs from the source:\n%s", table, d)
		}
	}
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where slot_name = $1`, env.Name); n != 0 {
		t.Error("the slot is still there")
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.cutovers where finalized_at is not null and slot_dropped_at is not null`); n != 1 {
		t.Error("the cutover record lacks its last steps")
	}
}

// A cutover while the application still writes is refused before anything is cut over, however
// fast the stream catches up; once the writes stop it succeeds. After it, no command writes into
// the target under any slot: run with another slot, backfill and verify --repair are refused.
func TestCutoverRefusesAWritingSourceAndAfterwardsEveryWriter(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, n int)`, `insert into a select g, 0 from generate_series(1, 100) g`)
	cfg := testConfig(t, env)
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	d.Stop(t)
	stop := sourceLoop(t, env, func(ctx context.Context, tx pgx.Tx, i int) error {
		_, err := tx.Exec(ctx, `update a set n = n + 1 where id = $1`, i%100+1)
		return err
	})
	_, err := operator.Cutover(context.Background(), operator.CutoverConfig{Run: cfg})
	stop()
	if err == nil || !strings.Contains(err.Error(), "the source still takes writes") {
		t.Fatalf("cutover while the source takes writes: %v, want a refusal", err)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.cutovers`); n != 0 {
		t.Fatalf("%d cutovers recorded despite the refusal", n)
	}
	pgtest.Eventually(t, 30*time.Second, "slot released", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where slot_name = $1 and active`, env.Name)
		return n == 0, "the slot is still active"
	})
	if _, err := operator.Cutover(context.Background(), operator.CutoverConfig{Run: cfg}); err != nil {
		t.Fatalf("cutover once the writes stopped: %v", err)
	}
	pgtest.WaitConverged(t, env, "a", "id")

	other := cfg
	other.Slot, other.Publication = env.Name+"_b", env.Name+"_b"
	requireRefusal(t, other, "was cut over into this target", "under any slot")
	if _, err := operator.Backfill(context.Background(), testBackfillConfig(t, env, "public.a")); err == nil || !strings.Contains(err.Error(), "backfill refused") {
		t.Errorf("backfill into a cut-over target: %v, want a refusal", err)
	}
	if _, err := verify.Run(context.Background(), verify.Config{Source: env.SourceURL, Target: env.TargetURL, Repair: true, Logger: cfg.Logger}); err == nil || !strings.Contains(err.Error(), "verify --repair refused") {
		t.Errorf("verify --repair of a cut-over target: %v, want a refusal", err)
	}
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where slot_name = $1`, other.Slot); n != 0 {
		t.Error("the refused run created its slot")
	}
}
