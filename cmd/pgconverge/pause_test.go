package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// runOut runs the command line args and returns what it printed; an error fails the test.
func runOut(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := run(context.Background(), args, &out, io.Discard); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args[:1], " "), err, out.String())
	}
	return out.String()
}

// pause and resume say what they changed, status shows the pause and the rate limits, backfill
// --set changes one limit of the running daemon and keeps the other, and a SIGHUP reloads the
// limits from the settings file.
func TestPauseResumeAndRateLimitCommands(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key)`, `insert into t select generate_series(1, 10)`)
	config := filepath.Join(t.TempDir(), "pgconverge.yaml")
	if err := os.WriteFile(config, []byte("run:\n  max-rows-per-second: 500\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startRun(t, env, "--config", config)
	pgtest.WaitConverged(t, env, "t", "id")
	target, slot := "--target="+env.TargetURL, "--slot="+env.Name

	got := runOut(t, "pause", target, slot, "--what", "stream,backfill")
	if want := fmt.Sprintf("paused stream of slot %[1]s\npaused backfill of slot %[1]s\n", env.Name); got != want {
		t.Errorf("pause printed %q, want %q", got, want)
	}
	if got := runOut(t, "pause", target, slot, "--what", "stream"); !strings.Contains(got, "stream of slot "+env.Name+" was paused already") {
		t.Errorf("pause again printed %q", got)
	}
	table := statusTable(t, env)
	for _, want := range []string{"PAUSED: stream since", "PAUSED: backfill since", "rate limits of backfills and verifies: 500 rows/s, no bytes limit (set by run"} {
		if !strings.Contains(table, want) {
			t.Errorf("status does not say %q:\n%s", want, table)
		}
	}
	if got := runOut(t, "backfill", "--set", target, slot, "--max-bytes-per-second", "8MiB"); !strings.Contains(got, "rate limits of slot "+env.Name+": 500 rows/s, 8.0 MiB/s") {
		t.Errorf("backfill --set printed %q", got)
	}
	_, raw := statusOf(t, env)
	slots := raw["slots"].([]any)
	controls := slots[0].(map[string]any)["controls"].(map[string]any)
	requireKeys(t, "controls", controls, "paused", "rate_limits")
	requireKeys(t, "controls.paused[0]", controls["paused"].([]any)[0], "what", "since", "by")
	requireKeys(t, "controls.rate_limits", controls["rate_limits"], "max_rows_per_second", "max_bytes_per_second", "set_at", "set_by")

	if err := os.WriteFile(config, []byte("max-rows-per-second: 900\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, 30*time.Second, "the SIGHUP's limits recorded", func() (bool, string) {
		rep, _ := statusOf(t, env)
		l := rep.Slots[0].Controls.Limits
		return l != nil && l.RowsPerSecond == 900 && l.BytesPerSecond == 8<<20 && l.SetBy == "SIGHUP: "+config, fmt.Sprintf("%+v", l)
	})

	got = runOut(t, "resume", target, slot)
	if want := fmt.Sprintf("resumed stream of slot %[1]s\nresumed backfill of slot %[1]s\nverify of slot %[1]s was not paused\n", env.Name); got != want {
		t.Errorf("resume printed %q, want %q", got, want)
	}
	pgtest.Exec(t, env.Source, `insert into t values (100)`)
	pgtest.WaitConverged(t, env, "t", "id")
}
