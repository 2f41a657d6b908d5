package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// statusOf runs `pgconverge status --format json` for the test's databases and returns the
// report and its JSON decoded as plain maps (to check the documented field names); an error or an
// exit status other than 0 fails the test.
func statusOf(t *testing.T, env *pgtest.Env) (operator.StatusReport, map[string]any) {
	t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), []string{"status", "--source", env.SourceURL, "--target", env.TargetURL,
		"--slot", env.Name, "--format", "json"}, &out, io.Discard)
	if code := exitCode(err); code != 0 {
		t.Fatalf("status: exit %d: %v", code, err)
	}
	var rep operator.StatusReport
	var raw map[string]any
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, out.String())
	}
	if err := json.Unmarshal(out.Bytes(), &raw); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, out.String())
	}
	return rep, raw
}

// statusTable runs `pgconverge status` in its table format and returns what it printed.
func statusTable(t *testing.T, env *pgtest.Env) string {
	t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), []string{"status", "--source", env.SourceURL, "--target", env.TargetURL, "--slot", env.Name}, &out, io.Discard)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out.String())
	}
	return out.String()
}

// requireKeys fails the test unless the JSON object m has every key in keys (null values count).
func requireKeys(t *testing.T, what string, m any, keys ...string) {
	t.Helper()
	obj, ok := m.(map[string]any)
	if !ok {
		t.Fatalf("%s: not a JSON object: %v", what, m)
	}
	for _, k := range keys {
		if _, ok := obj[k]; !ok {
			t.Errorf("%s: no %q in %v", what, k, obj)
		}
	}
}

// holdBackfill starts `pgconverge backfill` of table (operator.Backfill, 1 worker, 1,000-row
// chunks) and returns once its first chunk is committed, with the backfill held there (its run
// recorded as running, its table's backfill lock held) until release is called; backfilled then
// waits for it to end and returns its error. It is released at cleanup at the latest.
func holdBackfill(t *testing.T, env *pgtest.Env, table string) (release func(), backfilled func() error) {
	t.Helper()
	reached, held := make(chan struct{}), make(chan struct{})
	var once, unhold sync.Once
	release = func() { unhold.Do(func() { close(held) }) }
	done := make(chan error, 1)
	go func() {
		_, err := operator.Backfill(context.Background(), operator.BackfillConfig{
			Source: env.SourceURL, Target: env.TargetURL, Tables: []string{table}, Workers: 1, ChunkRows: 1000, Resume: true,
			Logger:     slog.New(slog.NewTextHandler(pgtest.LogWriter(t), nil)),
			AfterChunk: func(string, int64) { once.Do(func() { close(reached); <-held }) },
		})
		done <- err
	}()
	t.Cleanup(func() { release(); <-done })
	select {
	case <-reached:
	case err := <-done:
		done <- err
		t.Fatalf("backfill of %s ended before its first chunk was held: %v", table, err)
	case <-time.After(60 * time.Second):
		t.Fatalf("backfill of %s did not complete a chunk within 60 s", table)
	}
	return release, func() error { err := <-done; done <- err; return err }
}

// first returns the first element of the JSON array m[key].
func first(t *testing.T, m map[string]any, key string) any {
	t.Helper()
	a, ok := m[key].([]any)
	if !ok || len(a) == 0 {
		t.Fatalf("%s: not a non-empty JSON array: %v", key, m[key])
	}
	return a[0]
}

// status of a running daemon: its table followed with a lag in bytes and in seconds, its slot held
// by the daemon's walsender (pid, client, start, connected time, state, lags), the last verify run;
// of the stopped daemon: nothing follows, no session holds the slot, no lag in seconds.
func TestStatusRunningAndStopped(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `insert into a select g, 'v' from generate_series(1, 100) g`)
	d := startRun(t, env)
	pgtest.WaitStreaming(t, env)
	pgtest.WaitSlotCaughtUp(t, env)
	vrep, code, err := verifyCmd(t, env)
	if code != 0 {
		t.Fatalf("verify: exit %d: %v", code, err)
	}
	next := 1000
	var rep operator.StatusReport
	// PostgreSQL measures a walsender's lag only for transactions it sends: write while polling.
	pgtest.Eventually(t, 60*time.Second, "status of a streaming daemon with a measured lag", func() (bool, string) {
		next++
		pgtest.Exec(t, env.Source, fmt.Sprintf(`insert into a values (%d, 'w')`, next))
		rep, _ = statusOf(t, env)
		if len(rep.Tables) != 1 || len(rep.Slots) != 1 {
			return false, fmt.Sprintf("%+v", rep)
		}
		tb, s := rep.Tables[0], rep.Slots[0]
		ok := tb.Following && tb.Slot == env.Name && tb.LagSeconds != nil && s.Active && s.ActivePID != nil &&
			s.WalsenderState != nil && *s.WalsenderState == "streaming" && s.WriteLagSeconds != nil
		return ok, fmt.Sprintf("table %+v, slot %+v", tb, s)
	})
	tb, s := rep.Tables[0], rep.Slots[0]
	if tb.Table != "public.a" || tb.Status != coverage.Covered {
		t.Errorf("table: %+v, want public.a covered", tb)
	}
	if *tb.LagSeconds != *s.WriteLagSeconds || *tb.LagSeconds < 0 || *tb.LagSeconds > 30 {
		t.Errorf("lag_seconds %v, want the slot's write_lag_seconds %v (0..30 s)", *tb.LagSeconds, *s.WriteLagSeconds)
	}
	pid := pgtest.Scalar[int32](t, env.Source, `select active_pid from pg_replication_slots where slot_name = $1`, env.Name)
	if *s.ActivePID != pid || s.ClientAddr == nil || *s.ClientAddr != "127.0.0.1" || s.BackendStart == nil ||
		s.ConnectedSeconds == nil || *s.ConnectedSeconds < 0 || s.HolderNote != "" {
		t.Errorf("slot holder: %+v, want pid %d from 127.0.0.1 with its start", s, pid)
	}
	if since := time.Since(*s.BackendStart); since < 0 || since > 10*time.Minute {
		t.Errorf("backend_start %s is not a moment ago", s.BackendStart)
	}
	if v := rep.LastVerify; v == nil || v.RunID != vrep.RunID || v.Status != "completed" || v.Trigger != "manual" ||
		v.Tables != 1 || v.Open != 0 || v.OpenNow != 0 || v.FinishedAt == nil || v.SnapshotLSN == nil {
		t.Errorf("last verify: %+v, want run %d completed, 1 table, nothing open", v, vrep.RunID)
	}
	if len(rep.Backfills) != 0 {
		t.Errorf("backfills: %+v, want none running", rep.Backfills)
	}
	if out := statusTable(t, env); !strings.Contains(out, "slot "+env.Name+": held by pid ") || !strings.Contains(out, "walsender streaming") ||
		!strings.Contains(out, fmt.Sprintf("last verify: run %d (manual) completed", vrep.RunID)) {
		t.Errorf("status table of a running daemon:\n%s", out)
	}

	d.Stop(t)
	pgtest.Eventually(t, 30*time.Second, "status of the stopped daemon", func() (bool, string) {
		rep, _ = statusOf(t, env)
		return len(rep.Slots) == 1 && !rep.Slots[0].Active, fmt.Sprintf("%+v", rep.Slots)
	})
	rep, raw := statusOf(t, env)
	tb, s = rep.Tables[0], rep.Slots[0]
	if tb.Following || tb.LagSeconds != nil || tb.Status != coverage.Covered || !strings.Contains(tb.Note, "stopped:") {
		t.Errorf("table of a stopped daemon: %+v, want covered, not followed, no lag_seconds, a stopped: note", tb)
	}
	if !s.Exists || s.ActivePID != nil || s.ClientAddr != nil || s.BackendStart != nil || s.ConnectedSeconds != nil || s.WriteLagSeconds != nil {
		t.Errorf("slot of a stopped daemon: %+v, want it held by nobody", s)
	}
	requireKeys(t, "status", raw, "made_at", "source_lsn", "covered", "tables", "slots", "backfills", "last_verify")
	requireKeys(t, "table", first(t, raw, "tables"), "table", "status", "following", "slot", "watermark_lsn", "lag_bytes", "lag_seconds",
		"watermark_age_seconds", "gap_bytes", "note")
	requireKeys(t, "slot", first(t, raw, "slots"), "name", "exists", "active", "wal_status", "restart_lag_bytes", "active_pid", "application_name",
		"client_addr", "backend_start", "connected_seconds", "walsender_state", "write_lag_seconds", "flush_lag_seconds", "replay_lag_seconds")
	requireKeys(t, "last_verify", raw["last_verify"], "run_id", "trigger", "status", "started_at", "finished_at", "age_seconds", "snapshot_lsn",
		"tables", "found", "repaired", "open", "open_now")
	if out := statusTable(t, env); !strings.Contains(out, "slot "+env.Name+": no session holds it") || !strings.Contains(out, "public.a  covered  no") {
		t.Errorf("status table of a stopped daemon:\n%s", out)
	}
}

// A backfill held after its first chunk shows in status as running (its trigger, start, chunks
// done of planned, rows so far, its process alive) and is gone once it completed; status of a
// target without a ledger fails with exit 1, naming the fix.
func TestStatusRunningBackfill(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table b (id int primary key, v text)`, `insert into b select g, 'v' from generate_series(1, 5000) g`)
	err := run(context.Background(), []string{"status", "--source", env.SourceURL, "--target", env.TargetURL}, io.Discard, io.Discard)
	if exitCode(err) != 1 || !strings.Contains(fmt.Sprint(err), "run pgconverge run against it first") {
		t.Errorf("status without a ledger: exit %d: %v; want 1 naming the fix", exitCode(err), err)
	}

	release, backfilled := holdBackfill(t, env, "public.b")
	// A session that claimed a chunk, as a joined worker does, applies it as far as status knows.
	joiner := pgtest.Connect(t, env.TargetURL)
	if err := coverage.HoldWorkerLock(context.Background(), joiner); err != nil {
		t.Fatal(err)
	}
	if c, err := coverage.ClaimAnyChunk(context.Background(), joiner, pgtest.Scalar[int64](t, env.Target, `select max(id) from pgconverge.backfill_runs`)); c == nil || err != nil {
		t.Fatalf("claim a chunk: %v, %v", c, err)
	}
	rep, raw := statusOf(t, env)
	joiner.Close(context.Background()) // the run takes the chunk over
	if len(rep.Backfills) != 1 || len(rep.Backfills[0].Tables) != 1 {
		t.Fatalf("backfills: %+v, want one run of one table", rep.Backfills)
	}
	r, tb := rep.Backfills[0], rep.Backfills[0].Tables[0]
	if r.Trigger != "manual" || !r.Alive || r.Slot != "" || r.StartedAt.IsZero() || r.RunningSeconds < 0 || r.Workers != 1 || r.ChunkRows != 1000 || !r.Joinable {
		t.Errorf("running backfill run: %+v, want a live, joinable manual run with 1 worker of 1000-row chunks", r)
	}
	if tb := rep.Backfills[0].Tables[0]; tb.ChunksApplying != 1 {
		t.Errorf("chunks applying: %d, want 1 (the claimed one; the run's worker is held between chunks)", tb.ChunksApplying)
	}
	// A bulk load cuts the table by blocks: the chunks done hold the rows the target committed.
	copied := pgtest.Scalar[int64](t, env.Target, `select count(*) from b`)
	if tb.Table != "public.b" || tb.Status != "running" || tb.ChunksDone < 1 || tb.ChunksPlanned < tb.ChunksDone ||
		tb.Rows != copied || tb.Rows < 500 || tb.StartedAt.IsZero() {
		t.Errorf("running backfill of public.b: %+v, want the %d rows copied (about 1000 per chunk done)", tb, copied)
	}
	requireKeys(t, "backfill", first(t, raw, "backfills"), "run_id", "trigger", "started_at", "running_seconds", "alive", "workers", "chunk_rows", "joinable", "tables")
	requireKeys(t, "backfill table", first(t, first(t, raw, "backfills").(map[string]any), "tables"), "table", "status", "started_at",
		"chunks_done", "chunks_planned", "chunks_applying", "planning_complete", "rows")
	if out := statusTable(t, env); !strings.Contains(out, "backfills running:") || !strings.Contains(out, "public.b") || !strings.Contains(out, "manual") ||
		!strings.Contains(out, "pgconverge backfill --join --run ") {
		t.Errorf("status table during a backfill:\n%s", out)
	}
	release()
	if err := backfilled(); err != nil {
		t.Fatalf("backfill: %v", err)
	}
	rep, _ = statusOf(t, env)
	if len(rep.Backfills) != 0 || rep.LastVerify != nil {
		t.Errorf("after the backfill: backfills %+v, last verify %+v; want none of either", rep.Backfills, rep.LastVerify)
	}
}
