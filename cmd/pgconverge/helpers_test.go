package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// testWriter sends log lines to t.Log until the test ends.
type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func testConfig(t *testing.T, env *pgtest.Env) daemonConfig {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return daemonConfig{
		Source: env.SourceURL, Target: env.TargetURL, Slot: env.Name, Publication: env.Name,
		BackfillWorkers: 2, ChunkRows: 1000, OnGap: onGapBackfill,
		Logger: slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
}

// runningDaemon is `pgconverge run` in a goroutine of the test.
type runningDaemon struct {
	cancel context.CancelFunc
	done   chan error
}

// startDaemon starts the daemon with cfg; it is stopped (as by SIGTERM) at cleanup at the latest.
func startDaemon(t *testing.T, cfg daemonConfig) *runningDaemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &runningDaemon{cancel: cancel, done: make(chan error, 1)}
	go func() { d.done <- runDaemon(ctx, cfg) }()
	t.Cleanup(func() { d.stop(t) })
	return d
}

// stop cancels the daemon and requires a clean exit within 30 s.
func (d *runningDaemon) stop(t *testing.T) {
	t.Helper()
	if d.cancel == nil {
		return
	}
	d.cancel()
	d.cancel = nil
	select {
	case err := <-d.done:
		if err != nil {
			t.Errorf("daemon stopped with error: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("daemon did not stop within 30 s of cancellation")
	}
}

// waitExit waits up to timeout for the daemon to exit on its own and returns its error.
func (d *runningDaemon) waitExit(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-d.done:
		d.cancel = nil
		return err
	case <-time.After(timeout):
		t.Fatalf("daemon still runs after %s", timeout)
		return nil
	}
}

// requireRunning fails the test if the daemon has exited.
func (d *runningDaemon) requireRunning(t *testing.T) {
	t.Helper()
	select {
	case err := <-d.done:
		d.cancel = nil
		t.Fatalf("daemon exited: %v", err)
	default:
	}
}

// sourceColumns returns the table's replicated columns, quoted, in order.
func sourceColumns(t *testing.T, conn *pgx.Conn, table string) string {
	t.Helper()
	cols := pgtest.Rows(t, conn, fmt.Sprintf(`select quote_ident(attname) from pg_attribute
where attrelid = '%s'::regclass and attnum > 0 and not attisdropped and attgenerated = '' order by attnum`, table))
	return strings.Join(cols, ", ")
}

// waitConverged polls until the target's live rows of table equal the source's rows, compared as
// row(...)::text of the source's columns ordered by orderBy.
func waitConverged(t *testing.T, env *pgtest.Env, table, orderBy string) {
	t.Helper()
	waitConvergedColumns(t, env, table, sourceColumns(t, env.Source, table), orderBy)
}

// waitConvergedColumns is waitConverged comparing the columns cols (SQL, comma-separated).
func waitConvergedColumns(t *testing.T, env *pgtest.Env, table, cols, orderBy string) {
	t.Helper()
	src := fmt.Sprintf("select row(%s)::text from %s order by %s", cols, table, orderBy)
	tgt := fmt.Sprintf("select row(%s)::text from %s where not _cdc_deleted order by %s", cols, table, orderBy)
	pgtest.Eventually(t, 60*time.Second, "target "+table+" equals source", func() (bool, string) {
		want := pgtest.Rows(t, env.Source, src)
		var got []string
		rows, err := env.Target.Query(context.Background(), tgt)
		if err == nil {
			got, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			return false, err.Error()
		}
		d := pgtest.Diff(want, got)
		return d == "", d
	})
}

// waitSlotCaughtUp polls until the slot's confirmed_flush_lsn reaches the source's WAL insert
// position as read now (which, unlike pg_current_wal_lsn, covers commits not yet written under
// synchronous_commit = off), and returns that position.
func waitSlotCaughtUp(t *testing.T, env *pgtest.Env) string {
	t.Helper()
	var lsn string
	if err := env.Source.QueryRow(context.Background(), "select pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, 60*time.Second, "confirmed_flush_lsn reaches "+lsn, func() (bool, string) {
		var ok bool
		var seen *string
		err := env.Source.QueryRow(context.Background(), `select confirmed_flush_lsn >= $2::pg_lsn, confirmed_flush_lsn::text
from pg_replication_slots where slot_name = $1`, env.Name, lsn).Scan(&ok, &seen)
		if err != nil {
			return false, err.Error()
		}
		return ok, fmt.Sprint(*seen)
	})
	return lsn
}

// scalar runs a one-value query.
func scalar[T any](t *testing.T, conn *pgx.Conn, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// waitStreaming polls until the daemon's walsender streams from the slot (pg_stat_replication
// state catchup or streaming, not merely holding the slot it created): the initial load is over
// and changes from now on arrive through the stream.
func waitStreaming(t *testing.T, env *pgtest.Env) {
	t.Helper()
	pgtest.Eventually(t, 60*time.Second, "slot "+env.Name+" streaming", func() (bool, string) {
		var state string
		err := env.Source.QueryRow(context.Background(), `select coalesce(r.state, 'no walsender') from pg_replication_slots s
left join pg_stat_replication r on r.pid = s.active_pid where s.slot_name = $1`, env.Name).Scan(&state)
		if err != nil {
			return false, err.Error()
		}
		return state == "streaming" || state == "catchup", "walsender state " + state
	})
}

// requireRefusal runs the daemon with cfg (at most 30 s) and requires it to stop with an error
// that mentions every string of want.
func requireRefusal(t *testing.T, cfg daemonConfig, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := runDaemon(ctx, cfg)
	if err == nil {
		t.Fatalf("run succeeded, want an error mentioning %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}
