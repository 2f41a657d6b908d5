package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/operator"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// exitGap is the exit status of `pgconverge coverage --fail-on-gap` when the report is not
// covered (cmd/pgconverge's TestCoverageCommand checks the command itself).
const exitGap = 3

// coverageOf makes the coverage report of the test's databases as `pgconverge coverage --format
// json --fail-on-gap` does, through its JSON form, and returns it with the exit status the
// command would have.
func coverageOf(t *testing.T, env *pgtest.Env) (coverage.Report, int) {
	t.Helper()
	rep, err := operator.CoverageReport(context.Background(), operator.CoverageConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: env.Name})
	if err != nil {
		t.Fatalf("coverage: %v", err)
	}
	out, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	rep = coverage.Report{}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("coverage JSON: %v\n%s", err, out)
	}
	code := 0
	if !rep.Covered {
		code = exitGap
	}
	return rep, code
}

func tableReport(t *testing.T, rep coverage.Report, table string) coverage.TableReport {
	t.Helper()
	for _, tr := range rep.Tables {
		if tr.Table == table {
			return tr
		}
	}
	t.Fatalf("report has no table %s: %+v", table, rep.Tables)
	return coverage.TableReport{}
}

// dropSlot drops the test's slot, once the stopped daemon's walsender let go of it (it does so
// asynchronously).
func dropSlot(t *testing.T, env *pgtest.Env) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, "slot dropped", func() (bool, string) {
		_, err := env.Source.Exec(context.Background(), `select pg_drop_replication_slot($1)`, env.Name)
		return err == nil, fmt.Sprint(err)
	})
}

// advanceSlot advances the test's slot to at least to, as another consumer would. The slot moves
// up to the flushed WAL, which follows the insert position shortly, and a stopped daemon's
// walsender may still hold the slot for a moment.
func advanceSlot(t *testing.T, env *pgtest.Env, to pglogrepl.LSN) {
	t.Helper()
	pgtest.Eventually(t, 10*time.Second, "slot advanced past "+to.String(), func() (bool, string) {
		var end string
		err := env.Source.QueryRow(context.Background(), `select end_lsn::text from pg_replication_slot_advance($1, $2::pg_lsn)`,
			env.Name, to.String()).Scan(&end)
		if err != nil {
			return false, err.Error()
		}
		return lsnMust(t, end) >= to, end
	})
}

// holdLoad makes the daemon of cfg stop after the first loaded chunk of table until release is
// closed; reached is closed when it got there.
func holdLoad(cfg *Config, table string) (reached, release chan struct{}) {
	reached, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	cfg.Knobs.AfterLoadChunk = func(tab string, _ int64) {
		if tab == table {
			once.Do(func() { close(reached); <-release })
		}
	}
	return reached, release
}

// lsnOf reads an LSN from the source.
func lsnOf(t *testing.T, env *pgtest.Env, query string) pglogrepl.LSN {
	t.Helper()
	l, err := pglogrepl.ParseLSN(pgtest.Scalar[string](t, env.Source, query))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// requireGapCovers requires table to have status and exactly one gap, holding [from, to).
func requireGapCovers(t *testing.T, rep coverage.Report, table string, status coverage.Status, from, to pglogrepl.LSN) coverage.GapReport {
	t.Helper()
	tr := tableReport(t, rep, table)
	if tr.Status != status || len(tr.Gaps) != 1 {
		t.Fatalf("%s: status %s with gaps %+v, want %s with one gap", table, tr.Status, tr.Gaps, status)
	}
	g := tr.Gaps[0]
	if pglogrepl.LSN(g.FromLSN) > from || pglogrepl.LSN(g.ToLSN) < to || g.Bytes != uint64(g.ToLSN-g.FromLSN) || g.Keys != nil {
		t.Fatalf("%s: gap %+v does not hold the writes' range [%s, %s) for all keys", table, g, from, to)
	}
	return g
}

// waitCovered polls the report until every table is covered (exit status 0).
func waitCovered(t *testing.T, env *pgtest.Env) coverage.Report {
	t.Helper()
	var rep coverage.Report
	pgtest.Eventually(t, 60*time.Second, "coverage without gaps", func() (bool, string) {
		var code int
		rep, code = coverageOf(t, env)
		return code == 0 && rep.Covered, fmt.Sprintf("exit %d: %+v", code, rep.Tables)
	})
	return rep
}

// A normal run — initial load, then streaming — is covered, and exits 0.
func TestCoverageAfterLoadAndStream(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `create table b (id int primary key)`,
		`insert into a select g, 'v' from generate_series(1, 2500) g`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `update a set v = 'w' where id < 100`, `insert into b values (1)`)
	lsn := pgtest.WaitSlotCaughtUp(t, env)
	rep := waitCovered(t, env)
	for _, name := range []string{"public.a", "public.b"} {
		tr := tableReport(t, rep, name)
		if tr.BackfillLSN == nil || tr.StreamStartLSN == nil || *tr.StreamStartLSN > *tr.BackfillLSN || len(tr.Gaps) != 0 {
			t.Errorf("%s: %+v, want a backfill at or after the stream's start and no gap", name, tr)
		}
		if tr.WatermarkLSN.String() < "" || pglogrepl.LSN(tr.WatermarkLSN) < lsnMust(t, lsn) {
			t.Errorf("%s: watermark %s below the caught-up position %s", name, tr.WatermarkLSN, lsn)
		}
	}
	if len(rep.Slots) != 1 || !rep.Slots[0].Exists || !rep.Slots[0].Active || rep.Slots[0].Warning != "" {
		t.Errorf("slot health %+v, want one active slot without warning", rep.Slots)
	}
	// Another database of the source cluster is not the source: an error, not a report of gaps.
	_, err := operator.CoverageReport(context.Background(), operator.CoverageConfig{Source: os.Getenv("PGCONVERGE_TEST_SOURCE"), Target: env.TargetURL, Slot: "pgconverge"})
	if !errors.Is(err, coverage.ErrOtherSource) {
		t.Errorf("coverage against another source database: %v, want %v", err, coverage.ErrOtherSource)
	}
}

func lsnMust(t *testing.T, s string) pglogrepl.LSN {
	t.Helper()
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A dropped slot is a gap from the target's watermark to the new slot: reported (exit 3) while
// the daemon is down and with --on-gap=alert, closed by the backfill of --on-gap=backfill.
func TestDroppedSlotIsAGapUntilBackfilled(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`,
		`insert into a select g, 'v' from generate_series(1, 3000) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitSlotCaughtUp(t, env)
	waitCovered(t, env) // the initial load completed, not just its chunks
	d.Stop(t)
	dropSlot(t, env)
	from := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Exec(t, env.Source, `update a set v = 'lost' where id % 10 = 0`, `delete from a where id > 2900`,
		`insert into a values (5000, 'lost too')`)
	to := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)

	rep, code := coverageOf(t, env)
	if code != exitGap || rep.Covered || rep.Slots[0].Exists {
		t.Fatalf("exit %d, covered %v, slots %+v: want exit 3 and a missing slot", code, rep.Covered, rep.Slots)
	}
	requireGapCovers(t, rep, "public.a", coverage.GapStatus, from, to)

	alert := testConfig(t, env)
	alert.OnGap = OnGapAlert
	d = startDaemon(t, alert)
	pgtest.WaitStreaming(t, env)
	rep, code = coverageOf(t, env)
	g := requireGapCovers(t, rep, "public.a", coverage.GapStatus, from, to)
	if code != exitGap {
		t.Fatalf("with --on-gap=alert: exit %d, want 3", code)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from a where v = 'lost' and not _cdc_deleted`); n != 0 {
		t.Fatalf("--on-gap=alert backfilled %d rows", n)
	}
	if r := pgtest.Scalar[string](t, env.Target, `select end_reason from pgconverge.stream_segments where end_lsn is not null`); !strings.Contains(r, "missing") {
		t.Errorf("ended segment's reason %q does not say the slot was missing", r)
	}
	d.Stop(t)

	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	rep = waitCovered(t, env)
	if b := tableReport(t, rep, "public.a").BackfillLSN; b == nil || *b < g.ToLSN {
		t.Errorf("backfill LSN %v, want at or after the gap's end %s", b, g.ToLSN)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_runs where trigger = 'gap' and status = 'completed'`); n != 1 {
		t.Errorf("%d completed gap backfill runs, want 1", n)
	}
}

// A slot advanced by another consumer past the target's progress is never streamed from silently:
// the range it skipped is a gap, which the daemon backfills.
func TestSlotAdvancedElsewhereIsAGap(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `insert into a values (1, 'x')`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitSlotCaughtUp(t, env)
	waitCovered(t, env) // the initial load completed, not just its chunks
	d.Stop(t)
	from := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Exec(t, env.Source, `insert into a values (2, 'skipped')`, `update a set v = 'skipped' where id = 1`)
	to := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	advanceSlot(t, env, to)

	alert := testConfig(t, env)
	alert.OnGap = OnGapAlert
	d = startDaemon(t, alert)
	pgtest.WaitStreaming(t, env)
	rep, code := coverageOf(t, env)
	if code != exitGap {
		t.Fatalf("exit %d, want 3", code)
	}
	requireGapCovers(t, rep, "public.a", coverage.GapStatus, from, to)
	d.Stop(t)

	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
}

// coveredAThenB creates tables a (id, v; 1 row) and b (id, v; 3,000 rows) on the source, runs the
// daemon on a alone until coverage is clean, stops it, and returns a configuration selecting both.
func coveredAThenB(t *testing.T, env *pgtest.Env) Config {
	t.Helper()
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `create table b (id int primary key, v text)`,
		`insert into a values (1, 'x')`, `insert into b select g, 'v' from generate_series(1, 3000) g`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.a"}
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	d.Stop(t)
	cfg = testConfig(t, env)
	cfg.Tables = []string{"public.a", "public.b"}
	return cfg
}

// A table added to --tables later has a gap until its load completes: the report says loading
// while it runs.
func TestTableAddedLaterIsAGapUntilLoaded(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	cfg := coveredAThenB(t, env)
	reached, release := holdLoad(&cfg, "public.b")
	startDaemon(t, cfg)
	<-reached
	rep, code := coverageOf(t, env)
	close(release)
	b := tableReport(t, rep, "public.b")
	if code != exitGap || b.Status != coverage.Loading || len(b.Gaps) != 1 || b.Gaps[0].FromLSN != 0 || b.BackfillLSN != nil {
		t.Fatalf("exit %d, public.b %+v: want exit 3, loading, one gap from 0/0 and no backfill", code, b)
	}
	if a := tableReport(t, rep, "public.a"); a.Status != coverage.Covered {
		t.Errorf("public.a %s during b's load, want covered", a.Status)
	}
	pgtest.WaitConverged(t, env, "b", "id")
	waitCovered(t, env)
}

// An idle source whose only writes go to unpublished tables does not look stale: keepalives move
// the watermark, and the lag stays small.
func TestIdleSourceWatermarkAdvances(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `insert into a values (1)`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.a"}
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `create table noise (id serial primary key, v text)`,
		`insert into noise (v) select repeat('x', 200) from generate_series(1, 20000)`)
	after := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Eventually(t, 60*time.Second, "watermark passes "+after.String(), func() (bool, string) {
		rep, _ := coverageOf(t, env)
		a := tableReport(t, rep, "public.a")
		return pglogrepl.LSN(a.WatermarkLSN) >= after && a.Status == coverage.Covered, fmt.Sprintf("%+v", a)
	})
}

// A slot the source invalidated (WAL removed past max_slot_wal_keep_size while the daemon was
// down) is reported as a gap, then replaced: the daemon streams again, backfills, converges.
func TestInvalidatedSlotIsAGapNotACrashLoop(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`,
		`insert into a select g, 'v' from generate_series(1, 1000) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitSlotCaughtUp(t, env)
	waitCovered(t, env) // the initial load completed, not just its chunks
	d.Stop(t)
	from := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Exec(t, env.Source, `update a set v = 'lost' where id <= 500`, `delete from a where id > 990`)
	invalidateSlot(t, env)
	to := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	rep, code := coverageOf(t, env)
	if code != exitGap || len(rep.Slots) != 1 || rep.Slots[0].WALStatus != "lost" || !strings.Contains(rep.Slots[0].Warning, "invalidated") {
		t.Fatalf("exit %d, slots %+v: want exit 3 and a lost slot with a warning", code, rep.Slots)
	}
	requireGapCovers(t, rep, "public.a", coverage.GapStatus, from, to)

	requireSlotReplaced(t, env, "wal_status lost")
}

// requireSlotReplaced starts a daemon on env after its slot was lost and requires that it streams
// again, converges table a (key id), covers it, keeps running and names in the ended stream
// segment's reason why the old slot was lost (reason).
func requireSlotReplaced(t *testing.T, env *pgtest.Env, reason string) {
	t.Helper()
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	d.RequireRunning(t)
	if r := pgtest.Scalar[string](t, env.Target, `select end_reason from pgconverge.stream_segments where end_lsn is not null`); !strings.Contains(r, reason) {
		t.Errorf("ended segment's reason %q does not name %q", r, reason)
	}
}

// A slot advanced by someone else while the daemon loads a table before streaming: the server
// would silently start from the later position; the daemon notices once it holds the slot, and
// the range skipped is a gap.
func TestSlotAdvancedDuringTheLoadIsAGap(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	cfg := coveredAThenB(t, env)
	cfg.OnGap = OnGapAlert
	reached, release := holdLoad(&cfg, "public.b")
	startDaemon(t, cfg)
	<-reached
	from := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Exec(t, env.Source, `insert into a values (2, 'skipped')`)
	to := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	advanceSlot(t, env, to)
	close(release)
	pgtest.WaitConverged(t, env, "b", "id")
	pgtest.Eventually(t, 60*time.Second, "a gap for public.a", func() (bool, string) {
		rep, code := coverageOf(t, env)
		a := tableReport(t, rep, "public.a")
		return code == exitGap && a.Status == coverage.GapStatus && len(a.Gaps) == 1, fmt.Sprintf("exit %d, %+v", code, a)
	})
	rep, _ := coverageOf(t, env)
	requireGapCovers(t, rep, "public.a", coverage.GapStatus, from, to)
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from a where id = 2`); n != 0 {
		t.Errorf("the skipped row reached the target (%d rows): the test did not skip anything", n)
	}
}

// A session that recorded a table's new publication membership and then failed before it ended
// the table's span (here: the slot was busy) must not hide the change from the next session:
// the span keeps the membership it began with.
func TestMembershipChangeSurvivesAFailedStart(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `insert into a values (1, 'x')`)
	cfg := testConfig(t, env)
	cfg.OnGap = OnGapAlert
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	d.Stop(t)
	pub := `"` + env.Name + `"`
	pgtest.Exec(t, env.Source, `alter publication `+pub+` drop table a`, `insert into a values (2, 'missed')`,
		`alter publication `+pub+` add table a`)

	// Someone holds the slot: a daemon starting now records the memberships, then waits for it.
	// The stopped daemon's walsender lets go of the slot asynchronously.
	pgtest.Eventually(t, 30*time.Second, "slot released by the stopped daemon", func() (bool, string) {
		return !pgtest.Scalar[bool](t, env.Source, `select active from pg_replication_slots where slot_name = $1`, env.Name), ""
	})
	holder, err := pgsession.ConnectReplication(context.Background(), env.SourceURL)
	if err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(context.Background(), holder, env.Name, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + env.Name + "'"}}); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, cfg)
	pgtest.Eventually(t, 30*time.Second, "the new membership recorded", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.tables t where membership <> (
  select membership from pgconverge.table_spans s where s.table_name = t.table_name order by id desc limit 1)`)
		return n == 1, fmt.Sprint(n)
	})
	d.Stop(t)
	holder.Close(context.Background())

	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	rep, code := coverageOf(t, env)
	if a := tableReport(t, rep, "public.a"); code != exitGap || a.Status != coverage.GapStatus {
		t.Fatalf("exit %d, %+v: want exit 3 and a gap for a", code, a)
	}
}

// A source behind the target's progress (restored from a backup, failed over to a standby that
// lacks changes) would reuse LSNs the target holds: refused by the daemon and by the report. (A
// restore is simulated by moving the target's progress past the source's WAL position.)
func TestSourceBehindTheTargetIsRefused(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `insert into a values (1)`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	d.Stop(t)
	pgtest.Exec(t, env.Target, `update pgconverge.progress set applied_lsn = 'FF/0'`)
	_, err := operator.CoverageReport(context.Background(), operator.CoverageConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: "pgconverge"})
	if !errors.Is(err, coverage.ErrOtherSource) || !strings.Contains(err.Error(), "behind") {
		t.Errorf("coverage: %v, want %v saying the source is behind", err, coverage.ErrOtherSource)
	}
	requireRefusal(t, testConfig(t, env), "behind the target's progress", "new target database")
}

// Rows of two source databases must never mix in one target table (the version rule cannot order
// their LSNs): a backfill from another source into a streamed table is refused, and so is a daemon
// that would follow a table another source's backfill loaded.
func TestAnotherSourceIsRefusedPerTable(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `create table b (id int primary key)`,
		`insert into a values (1)`, `insert into b values (1)`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.a"}
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	admin := pgtest.Connect(t, os.Getenv("PGCONVERGE_TEST_SOURCE"))
	pgtest.Exec(t, admin, `drop table if exists public.a, public.b`, `create table public.a (id int primary key)`,
		`create table public.b (id int primary key)`, `insert into public.b values (2)`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Connect(t, os.Getenv("PGCONVERGE_TEST_SOURCE")), `drop table if exists public.a, public.b`)
	})
	other := testBackfillConfig(t, env, "public.a")
	other.Source = os.Getenv("PGCONVERGE_TEST_SOURCE")
	if _, err := operator.Backfill(context.Background(), other); !errors.Is(err, coverage.ErrOtherSource) {
		t.Fatalf("backfill of a streamed table from another source: %v, want %v", err, coverage.ErrOtherSource)
	}
	other.Tables = []string{"public.b"}
	backfillNow(t, other) // no stream follows b yet
	d.Stop(t)
	cfg.Tables = []string{"public.a", "public.b"}
	requireRefusal(t, cfg, "holds rows of source database", "DROP TABLE")
}
