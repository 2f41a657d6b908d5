package engine_test

import (
	"sync"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/internal/schedule"
)

// The schedule fires while the daemon streams; a tick while the previous scheduled backfill is
// still running is skipped; the held backfill then completes and the table stays equal.
func TestScheduledBackfill(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table s (id int primary key, v int)`, `insert into s select g, g from generate_series(1, 3000) g`)
	cfg := testConfig(t, env)
	var err error
	if cfg.BackfillSchedule, err = schedule.Parse("@every 1s"); err != nil {
		t.Fatal(err)
	}
	events := make(chan schedule.Event, 100)
	cfg.Knobs.Schedule = func(ev schedule.Event) {
		select {
		case events <- ev:
		default: // the test stopped listening
		}
	}
	release := make(chan struct{})
	var once sync.Once
	cfg.Knobs.AfterScheduledChunk = func(string, int64) { once.Do(func() { <-release }) }
	startDaemon(t, cfg)
	waitFor := func(want schedule.Event) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case ev := <-events:
				if ev == want {
					return
				}
				if ev == schedule.Failed {
					t.Fatalf("scheduled backfill failed while waiting for %q", want)
				}
			case <-timeout:
				t.Fatalf("no %q event within 30 s", want)
			}
		}
	}
	waitFor(schedule.Started)
	pgtest.Exec(t, env.Source, `update s set v = -v where id % 7 = 0`, `delete from s where id % 11 = 0`)
	waitFor(schedule.Skipped) // the first one is held after its first chunk
	close(release)
	waitFor(schedule.Completed)
	pgtest.WaitConverged(t, env, "s", "id")
	got := pgtest.Rows(t, env.Target, `select distinct trigger || ' ' || status from pgconverge.backfill_runs where status <> 'running' order by 1`)
	if d := pgtest.Diff([]string{"initial completed", "schedule completed"}, got); d != "" {
		t.Errorf("runs: %s", d)
	}
}
