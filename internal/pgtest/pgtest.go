// Package pgtest gives integration tests their own databases on the private source and target
// clusters that scripts/test.sh starts (scripts/pgcluster.sh). The cluster URLs come from
// PGCONVERGE_TEST_SOURCE and PGCONVERGE_TEST_TARGET; without them a test skips, or fails when
// PGCONVERGE_REQUIRE_INTEGRATION=1 (as in CI), so integration tests can never silently not run.
package pgtest

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Env is one test's pair of databases: the source (wal_level=logical) and the target, both named
// after the test, created empty and dropped with their replication slots when the test ends.
type Env struct {
	// Name is the databases' name, also usable as a slot or publication name.
	Name                 string
	SourceURL, TargetURL string
	// Source and Target are connections to the test's databases, closed at cleanup.
	Source, Target *pgx.Conn
}

var unsafe = regexp.MustCompile(`[^a-z0-9_]+`)

// New creates the test's databases. The name is derived from t.Name(): lower-cased, reduced to
// [a-z0-9_], cut to fit, with a short hash so that long names stay unique.
func New(t *testing.T) *Env {
	t.Helper()
	srcAdmin, tgtAdmin := os.Getenv("PGCONVERGE_TEST_SOURCE"), os.Getenv("PGCONVERGE_TEST_TARGET")
	if srcAdmin == "" || tgtAdmin == "" {
		if os.Getenv("PGCONVERGE_REQUIRE_INTEGRATION") == "1" {
			t.Fatal("PGCONVERGE_TEST_SOURCE and PGCONVERGE_TEST_TARGET are not set: run the tests with scripts/test.sh")
		}
		t.Skip("integration test: run scripts/test.sh (PGCONVERGE_TEST_SOURCE / PGCONVERGE_TEST_TARGET unset)")
	}
	sum := sha1.Sum([]byte(t.Name()))
	base := unsafe.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(base) > 40 {
		base = base[:40]
	}
	e := &Env{Name: "t_" + base + "_" + hex.EncodeToString(sum[:3])}
	e.SourceURL = recreate(t, srcAdmin, e.Name, true)
	e.TargetURL = recreate(t, tgtAdmin, e.Name, false)
	e.Source = Connect(t, e.SourceURL)
	e.Target = Connect(t, e.TargetURL)
	return e
}

// Connect opens a connection for the test and closes it at cleanup.
func Connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// recreate drops and creates database name on the cluster of adminURL and returns its URL. At
// cleanup it drops the database and, on the source, the slots that belong to it.
func recreate(t *testing.T, adminURL, name string, source bool) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatalf("connect to test cluster %s: %v", adminURL, err)
	}
	defer admin.Close(ctx)
	drop := func(c *pgx.Conn) error {
		if source {
			_, err := c.Exec(ctx, `select pg_terminate_backend(active_pid) from pg_replication_slots where database = $1 and active_pid is not null`, name)
			if err != nil {
				return err
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, err = c.Exec(ctx, `select pg_drop_replication_slot(slot_name) from pg_replication_slots where database = $1`, name)
				if err == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond) // a terminated walsender releases its slot asynchronously
			}
			if err != nil {
				return err
			}
		}
		_, err := c.Exec(ctx, "drop database if exists "+pgx.Identifier{name}.Sanitize()+" with (force)")
		return err
	}
	if err := drop(admin); err != nil {
		t.Fatalf("drop old test database %s: %v", name, err)
	}
	// FILE_COPY (PostgreSQL 15 and later) writes a few WAL records where the default WAL_LOG
	// writes the whole template, about 4 MB, which every logical walsender of the cluster then
	// reads through.
	create := "create database " + pgx.Identifier{name}.Sanitize()
	var version int
	if err := admin.QueryRow(ctx, `select current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatalf("read the server version: %v", err)
	}
	if version >= 150000 {
		create += " strategy = file_copy"
	}
	if _, err := admin.Exec(ctx, create); err != nil {
		t.Fatalf("create test database %s: %v", name, err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Errorf("connect for cleanup: %v", err)
			return
		}
		defer c.Close(ctx)
		if err := drop(c); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	u, err := url.Parse(adminURL)
	if err != nil {
		t.Fatalf("parse %s: %v", adminURL, err)
	}
	u.Path = "/" + name
	return u.String()
}

// Exec runs each statement on conn and fails the test on error.
func Exec(t *testing.T, conn *pgx.Conn, sql ...string) {
	t.Helper()
	for _, s := range sql {
		if _, err := conn.Exec(context.Background(), s); err != nil {
			t.Fatalf("exec %q: %v", s, err)
		}
	}
}

// Eventually polls cond every 50 ms until it returns true or timeout passes, then fails the test
// with cond's last description of what it saw.
func Eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, seen := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s; last seen: %s", what, timeout, seen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Restart restarts the "source" or "target" cluster (a fast shutdown, then start) with the command
// in PGCONVERGE_TEST_RESTART_SOURCE or PGCONVERGE_TEST_RESTART_TARGET. Connections to it break.
func Restart(t *testing.T, side string) { RestartMode(t, side, "fast") }

// RestartMode is Restart with the shutdown mode: "fast", or "immediate" (a crash: the server
// recovers from its WAL when it starts), passed to the restart command as its last argument.
func RestartMode(t *testing.T, side, mode string) {
	t.Helper()
	name := "PGCONVERGE_TEST_RESTART_" + strings.ToUpper(side)
	cmd := os.Getenv(name)
	if cmd == "" {
		t.Fatalf("%s is not set: run the tests with scripts/test.sh", name)
	}
	out, err := exec.Command("sh", "-c", cmd+" "+mode).CombinedOutput()
	if err != nil {
		t.Fatalf("restart %s: %v\n%s", side, err, out)
	}
}

// Rows returns the rows of query as text, one string per row (row(...)::text of the columns).
func Rows(t *testing.T, conn *pgx.Conn, query string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), query)
	if err != nil {
		t.Fatalf("query %q: %v", query, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("query %q: %v", query, err)
	}
	return out
}

// Diff describes the first difference between two row lists, or returns "" when they are equal.
func Diff(want, got []string) string {
	if len(want) != len(got) {
		return fmt.Sprintf("%d rows on the source, %d on the target", len(want), len(got))
	}
	for i := range want {
		if want[i] != got[i] {
			return fmt.Sprintf("row %d: source %s, target %s", i, want[i], got[i])
		}
	}
	return ""
}
