package engine_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/control"
	. "github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// pacingEvents is a Monitor that keeps what the daemon reports of its pauses, holds and limits.
type pacingEvents struct {
	NopMonitor
	mu     sync.Mutex
	paused map[string]bool
	held   map[string]bool // path/cause
	ever   map[string]bool // every path/cause held once
	limits pacing.Limits
}

func newPacingEvents() *pacingEvents {
	return &pacingEvents{paused: map[string]bool{}, held: map[string]bool{}, ever: map[string]bool{}}
}

func (m *pacingEvents) Paused(part string, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.paused[part] = on
}

func (m *pacingEvents) PacingHeld(path, cause string, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held[path+"/"+cause] = on
	m.ever[path+"/"+cause] = m.ever[path+"/"+cause] || on
}

func (m *pacingEvents) RateLimits(l pacing.Limits) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.limits = l
}

func (m *pacingEvents) state() (paused, held, ever map[string]bool, limits pacing.Limits) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return clone(m.paused), clone(m.held), clone(m.ever), m.limits
}

func clone(m map[string]bool) map[string]bool {
	out := map[string]bool{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// waitPaused waits until the daemon reports part paused to mon.
func waitPaused(t *testing.T, mon *pacingEvents, part string) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, "the daemon reports "+part+" paused", func() (bool, string) {
		p, _, _, _ := mon.state()
		return p[part], fmt.Sprint(p)
	})
}

// waitStatusUpdates waits until the daemon's walsender has sent everything up to lsn and then
// received n more status updates from the daemon (pg_stat_replication.reply_time): what a running
// stream would have applied and confirmed by then.
func waitStatusUpdates(t *testing.T, env *pgtest.Env, lsn string, n int) {
	t.Helper()
	var first time.Time
	seen := 0
	pgtest.Eventually(t, 60*time.Second, fmt.Sprintf("the walsender sent %s and had %d status updates since", lsn, n), func() (bool, string) {
		var sent bool
		var reply *time.Time
		err := env.Source.QueryRow(context.Background(), `select r.sent_lsn >= $2::pg_lsn, r.reply_time from pg_replication_slots s
join pg_stat_replication r on r.pid = s.active_pid where s.slot_name = $1`, env.Name, lsn).Scan(&sent, &reply)
		if err != nil || !sent || reply == nil {
			return false, fmt.Sprint("not sent yet: ", err)
		}
		if first.IsZero() || reply.After(first) {
			first = *reply
			seen++
		}
		return seen > n, fmt.Sprintf("%d status updates", seen-1)
	})
}

// A paused stream reads the slot no further, also after the daemon restarts, and status shows the
// pause; resumed, the table converges with nothing lost.
func TestPauseSurvivesADaemonRestart(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key, v text)`, `insert into t select g, 'a' from generate_series(1, 100) g`)
	mon := newPacingEvents()
	cfg := testConfig(t, env)
	cfg.Monitor, cfg.Knobs.ControlEvery, cfg.Knobs.StatusInterval = mon, 200*time.Millisecond, time.Second
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "t", "id")
	ctx := context.Background()
	res, err := operator.Pause(ctx, operator.PauseConfig{Target: env.TargetURL, Slot: cfg.Slot, Parts: control.Parts})
	if err != nil || !slices.Equal(res.Changed, control.Parts) {
		t.Fatalf("pause: %+v, %v; want every part paused now", res, err)
	}
	waitPaused(t, mon, control.Stream)
	pgtest.Exec(t, env.Source, `update t set v = 'b' where id <= 50`, `insert into t values (1000, 'new')`)
	lsn := pgtest.Scalar[string](t, env.Source, `select pg_current_wal_insert_lsn()::text`)
	requireNotApplied := func(when string) {
		t.Helper()
		waitStatusUpdates(t, env, lsn, 3)
		if n := pgtest.Scalar[int](t, env.Target, `select count(*) from t where v = 'b' or id = 1000`); n != 0 {
			t.Fatalf("%s: the target holds %d changed rows, want none while the stream is paused", when, n)
		}
		if c := pgtest.Scalar[string](t, env.Source, `select confirmed_flush_lsn::text from pg_replication_slots where slot_name = $1`, cfg.Slot); pgtest.Scalar[bool](t, env.Source, `select $1::pg_lsn >= $2::pg_lsn`, c, lsn) {
			t.Fatalf("%s: the slot was confirmed at %s, past the changes made while paused (%s)", when, c, lsn)
		}
	}
	requireNotApplied("paused")

	d.Stop(t)
	mon2 := newPacingEvents()
	cfg.Monitor = mon2
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	requireNotApplied("after a restart")
	if p, _, _, _ := mon2.state(); !p[control.Stream] || !p[control.Backfill] || !p[control.Verify] {
		t.Errorf("the restarted daemon reports paused %v, want stream, backfill and verify", p)
	}
	st, err := operator.Status(ctx, operator.StatusConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: cfg.Slot})
	if err != nil {
		t.Fatal(err)
	}
	var paused []string
	for _, s := range st.Slots {
		if s.Name == cfg.Slot {
			for _, p := range s.Controls.Paused {
				paused = append(paused, p.What)
			}
		}
	}
	if !slices.Equal(paused, control.Parts) {
		t.Errorf("status shows paused %v, want %v", paused, control.Parts)
	}

	res, err = operator.Resume(ctx, operator.PauseConfig{Target: env.TargetURL, Slot: cfg.Slot, Parts: control.Parts})
	if err != nil || !slices.Equal(res.Changed, control.Parts) || len(res.State.Paused) != 0 {
		t.Fatalf("resume: %+v, %v; want every part resumed", res, err)
	}
	pgtest.WaitConverged(t, env, "t", "id")
}

// Rate limits changed while the daemon runs (backfill --set writes them to the ledger) reach it,
// and a WAL budget reached while the stream is paused resumes the stream by itself and holds the
// backfills and verifies until the stream caught up; the slot survives.
func TestWALBudgetResumesAPausedStreamAndHoldsBackfills(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key, v text)`, `insert into t select g, 'a' from generate_series(1, 100) g`)
	mon := newPacingEvents()
	cfg := testConfig(t, env)
	cfg.Monitor, cfg.WALBudget = mon, 32<<20
	cfg.Limits = pacing.Limits{RowsPerSecond: 1000}
	cfg.Knobs.ControlEvery, cfg.Knobs.SourceLoadEvery, cfg.Knobs.StatusInterval = 200*time.Millisecond, 200*time.Millisecond, time.Second
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "t", "id")
	ctx := context.Background()
	l, err := operator.SetRateLimits(ctx, env.TargetURL, cfg.Slot, func(l *pacing.Limits) { l.BytesPerSecond = 1 << 20 }, "backfill --set")
	if want := (pacing.Limits{RowsPerSecond: 1000, BytesPerSecond: 1 << 20}); err != nil || l != want {
		t.Fatalf("set the rate limits: %+v, %v; want %+v (the run's rows kept)", l, err, want)
	}
	pgtest.Eventually(t, 30*time.Second, "the daemon follows the new limits", func() (bool, string) {
		_, _, _, got := mon.state()
		return got == l, fmt.Sprint(got)
	})

	if _, err := operator.Pause(ctx, operator.PauseConfig{Target: env.TargetURL, Slot: cfg.Slot, Parts: []string{control.Stream}}); err != nil {
		t.Fatal(err)
	}
	waitPaused(t, mon, control.Stream)
	// About 60 MiB of WAL: past 80% of the 32 MiB budget while the stream is paused.
	pgtest.Exec(t, env.Source, `insert into t select g, repeat('x', 200) from generate_series(1001, 200000) g`)
	pgtest.Eventually(t, 60*time.Second, "the stream resumed by itself and the backfills were held on the WAL budget", func() (bool, string) {
		p, _, ever, _ := mon.state()
		return !p[control.Stream] && ever["backfill/"+pacing.CauseWALBudget], fmt.Sprint(p, ever)
	})
	if n := pgtest.Scalar[int](t, env.Target, `select count(*) from pgconverge.pauses where slot = $1`, cfg.Slot); n != 0 {
		t.Errorf("%d pauses left in the ledger, want the stream's deleted", n)
	}
	pgtest.WaitConverged(t, env, "t", "id")
	pgtest.Eventually(t, 60*time.Second, "the backfills go on once the stream caught up", func() (bool, string) {
		_, held, _, _ := mon.state()
		return !held["backfill/"+pacing.CauseWALBudget], fmt.Sprint(held)
	})
	if st := pgtest.Scalar[string](t, env.Source, `select coalesce(wal_status, 'none') from pg_replication_slots where slot_name = $1`, cfg.Slot); st == "lost" || st == "none" {
		t.Errorf("slot wal_status %s, want it kept", st)
	}
}

// A backfill's rate limit holds it to the limit, on both of its paths: the direct COPY of a table
// the target holds none of, and the batch merge of one it holds.
func TestRateLimitPacesABackfill(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	const rows, limit = 12000, 4000.0
	pgtest.Exec(t, env.Source, `create table t (id int primary key, v text)`, fmt.Sprintf(`insert into t select g, 'a' from generate_series(1, %d) g`, rows))
	for _, path := range []string{"copy", "merge"} {
		cfg := testBackfillConfig(t, env, "public.t")
		cfg.Pacer = pacing.New(pacing.Limits{RowsPerSecond: limit}, nil)
		began := time.Now()
		rep, err := operator.Backfill(context.Background(), cfg)
		took := time.Since(began)
		if err != nil || rep.Rows != rows {
			t.Fatalf("%s: %+v, %v", path, rep, err)
		}
		// The first second's worth is the burst.
		if least := time.Duration((rows - limit) / limit * float64(time.Second)); took < least {
			t.Errorf("%s: %d rows at %.0f rows/s took %s, want at least %s", path, rows, limit, took, least)
		}
		if path == "copy" && rep.Result.Applied != rows {
			t.Errorf("copy: applied %d, want %d", rep.Result.Applied, rows)
		}
	}
	pgtest.WaitConverged(t, env, "t", "id")
}

// With --pace, the source's active sessions past the limit hold the daemon's loads, backfills
// and verifies, and the hold ends once they are under it again.
func TestPacingWaitsWhileTheSourceIsBusy(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key)`, `insert into t select generate_series(1, 10)`)
	mon := newPacingEvents()
	cfg := testConfig(t, env)
	cfg.Monitor, cfg.Pacing = mon, LoadLimits{Enabled: true, ActiveSessions: 3}
	cfg.Knobs.SourceLoadEvery = 200 * time.Millisecond
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "t", "id")
	ctx, cancel := context.WithCancel(context.Background())
	var busy sync.WaitGroup
	for range 6 {
		conn := pgtest.Connect(t, env.SourceURL)
		busy.Go(func() { conn.Exec(ctx, `select pg_sleep(60)`) })
	}
	pgtest.Eventually(t, 30*time.Second, "loads, backfills and verifies held while 6 sessions are active", func() (bool, string) {
		_, held, _, _ := mon.state()
		return held["load/load"] && held["backfill/load"] && held["verify/load"], fmt.Sprint(held)
	})
	cancel()
	busy.Wait()
	pgtest.Eventually(t, 60*time.Second, "the holds end once the sessions ended", func() (bool, string) {
		_, held, _, _ := mon.state()
		return !held["load/load"] && !held["backfill/load"] && !held["verify/load"], fmt.Sprint(held)
	})
}

// splitCounter counts the splits of backfill reads (Monitor.BackfillReadSplit).
type splitCounter struct {
	NopMonitor
	mu     sync.Mutex
	splits int
}

func (m *splitCounter) BackfillReadSplit(string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.splits++
}

// A chunk read past the time cap splits the table's further reads, each half as many rows down to
// 100, continuing after the last key read: every row arrives once.
func TestChunkTimeCapSplitsReads(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key, v text)`, `insert into t select g, md5(g::text) from generate_series(1, 6000) g`)
	// A first backfill into the empty target reads block ranges, which are never split; the
	// second reads key ranges and merges them, the target holding their keys.
	backfillNow(t, testBackfillConfig(t, env, "public.t"))
	mon := &splitCounter{}
	cfg := testBackfillConfig(t, env, "public.t")
	cfg.ChunkTimeCap, cfg.Monitor = time.Nanosecond, mon // every read passes it
	rep, err := operator.Backfill(context.Background(), cfg)
	if err != nil || rep.Rows != 6000 || rep.Result.Applied != 6000 {
		t.Fatalf("backfill: %+v, %v; want 6000 rows read and applied once", rep, err)
	}
	// From about 1,000 rows a chunk: 500, 250, 125, then 100 (or 400, 200, 100).
	if mon.splits < 3 {
		t.Errorf("%d splits, want at least 3", mon.splits)
	}
	pgtest.WaitConverged(t, env, "t", "id")
}

// An operator's backfill pause that holds up the initial load, before any stream runs, is lifted
// once the slot reaches 80% of the WAL budget: only the load's end lets the stream move the slot.
func TestWALBudgetLiftsABackfillPauseThatHoldsTheLoad(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key, v text)`, `insert into t select g, 'a' from generate_series(1, 100) g`,
		`create table noise (v text)`)
	ctx := context.Background()
	if _, err := operator.Pause(ctx, operator.PauseConfig{Target: env.TargetURL, Slot: env.Name, Parts: []string{control.Backfill}}); err != nil {
		t.Fatal(err)
	}
	mon := newPacingEvents()
	cfg := testConfig(t, env)
	cfg.Monitor, cfg.WALBudget = mon, 32<<20
	cfg.Knobs.ControlEvery, cfg.Knobs.SourceLoadEvery = 200*time.Millisecond, 200*time.Millisecond
	startDaemon(t, cfg)
	pgtest.Eventually(t, 30*time.Second, "the slot created and the load paused", func() (bool, string) {
		p, _, _, _ := mon.state()
		n := pgtest.Scalar[int](t, env.Source, `select count(*) from pg_replication_slots where slot_name = $1`, env.Name)
		return p[control.Backfill] && n == 1, fmt.Sprint(p, n)
	})
	if n := pgtest.Scalar[int](t, env.Target, `select count(*) from pgconverge.tables where loaded_lsn is not null`); n != 0 {
		t.Fatalf("%d tables loaded while the backfills are paused", n)
	}
	pgtest.Exec(t, env.Source, `insert into noise select repeat('x', 200) from generate_series(1, 200000)`)
	pgtest.WaitConverged(t, env, "t", "id")
	if n := pgtest.Scalar[int](t, env.Target, `select count(*) from pgconverge.pauses where slot = $1`, env.Name); n != 0 {
		t.Errorf("%d pauses left, want the backfill pause lifted", n)
	}
}
