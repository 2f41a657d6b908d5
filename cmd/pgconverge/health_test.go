package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// ternLock is the advisory lock tern (github.com/jackc/tern/v2/migrate) takes on the target to
// serialise migrations, which every daemon session applies first (migrations.Apply): holding it
// keeps a session from getting any further, so the test can look at a daemon that is not
// streaming for as long as it needs.
const ternLock = 9628173550095224

// get returns the status code and body of http://addr/path; ok is false while nothing answers.
func get(addr, path string) (code int, body string, ok bool) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error(), false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err.Error(), false
	}
	return resp.StatusCode, string(b), true
}

// waitReadyz polls /readyz until it answers code with a body that starts with prefix, and
// requires /healthz to answer 200 "ok" then too.
func waitReadyz(t *testing.T, addr string, code int, prefix string) {
	t.Helper()
	pgtest.Eventually(t, 60*time.Second, fmt.Sprintf("/readyz %d %q", code, prefix), func() (bool, string) {
		c, body, ok := get(addr, "/readyz")
		return ok && c == code && strings.HasPrefix(body, prefix) && strings.Count(body, "\n") == 1, fmt.Sprintf("%d %q", c, body)
	})
	if c, body, _ := get(addr, "/healthz"); c != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q, want 200 \"ok\"", c, body)
	}
}

// /healthz answers 200 while the daemon serves; /readyz 503 with the reason while the daemon
// starts (held before its first session prepares the target), while it loads its tables (waiting
// for a manual backfill of the table held mid-run), 200 once it streams, 503 again while it
// reconnects after its walsender was terminated (held the same way), and 200 after.
func TestHealthEndpoints(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `insert into a select generate_series(1, 3000)`)
	release, backfilled := holdBackfill(t, env, "public.a")
	hold := pgtest.Connect(t, env.TargetURL)
	pgtest.Exec(t, hold, fmt.Sprintf(`select pg_advisory_lock(%d)`, ternLock))
	addr := freeAddr(t)
	startRun(t, env, "--metrics-addr", addr)
	waitReadyz(t, addr, http.StatusServiceUnavailable, "not ready: starting: ")
	pgtest.Exec(t, hold, fmt.Sprintf(`select pg_advisory_unlock(%d)`, ternLock))
	waitReadyz(t, addr, http.StatusServiceUnavailable, "not ready: loading tables before streaming (backfill trigger initial;")
	release()
	if err := backfilled(); err != nil {
		t.Fatalf("backfill: %v", err)
	}
	waitReadyz(t, addr, http.StatusOK, "ok: streaming")
	pgtest.WaitStreaming(t, env)

	pgtest.Exec(t, hold, fmt.Sprintf(`select pg_advisory_lock(%d)`, ternLock))
	pgtest.Exec(t, env.Source, fmt.Sprintf(`select pg_terminate_backend(active_pid) from pg_replication_slots where slot_name = '%s'`, env.Name))
	waitReadyz(t, addr, http.StatusServiceUnavailable, "not ready: reconnecting after an error (reason connection;")
	pgtest.Exec(t, hold, fmt.Sprintf(`select pg_advisory_unlock(%d)`, ternLock))
	waitReadyz(t, addr, http.StatusOK, "ok: streaming")
}
