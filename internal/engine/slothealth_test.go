package engine_test

import (
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// newTestLogger returns a text logger at INFO that writes to the test's log and to buf.
func newTestLogger(t *testing.T, buf *pgtest.SyncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.MultiWriter(buf, pgtest.LogWriter(t)), nil))
}

// A slot that holds WAL close to max_slot_wal_keep_size (the stream stalled behind a busy target)
// is logged at WARN before the source invalidates it, and at INFO once it caught up.
func TestSlotAtRiskIsWarned(t *testing.T) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `create table noise (v text)`)
	cfg := testConfig(t, env)
	var logs pgtest.SyncBuffer
	cfg.Logger = newTestLogger(t, &logs)
	var mu sync.Mutex
	gate := make(chan struct{})
	stall := false
	cfg.Knobs.Stream.OnGroup = func(int, bool) {
		mu.Lock()
		s := stall
		mu.Unlock()
		if s {
			<-gate
		}
	}
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `alter system set max_slot_wal_keep_size = '1MB'`, `select pg_reload_conf()`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Connect(t, env.SourceURL), `alter system reset max_slot_wal_keep_size`, `select pg_reload_conf()`)
	})
	mu.Lock()
	stall = true
	mu.Unlock()
	released := false
	release := func() {
		if !released {
			released = true
			mu.Lock()
			stall = false
			mu.Unlock()
			close(gate)
		}
	}
	t.Cleanup(release)
	pgtest.Exec(t, env.Source, `insert into a values (1, 'stalled')`)
	warning := `level=WARN msg="slot \"` + env.Name + `\" `
	pgtest.Eventually(t, 60*time.Second, "a WARN line on the slot at risk", func() (bool, string) {
		if strings.Contains(logs.String(), warning) {
			return true, ""
		}
		pgtest.Exec(t, env.Source, `insert into noise select repeat('x', 1000) from generate_series(1, 2000)`)
		return false, pgtest.Scalar[string](t, env.Source, `select coalesce(wal_status, '') || ' ' || coalesce(safe_wal_size::text, 'null') from pg_replication_slots where slot_name = $1`, env.Name)
	})
	release()
	pgtest.Exec(t, env.Source, `alter system reset max_slot_wal_keep_size`, `select pg_reload_conf()`)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.Eventually(t, 60*time.Second, "an INFO line once the slot is no longer at risk", func() (bool, string) {
		return strings.Contains(logs.String(), `level=INFO msg="slot no longer at risk of losing WAL"`), ""
	})
}
