package pgtest

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Standby is a physical standby of the test source cluster, made by NewStandby with
// scripts/pgcluster.sh standby: a copy of the whole cluster (every test database in it) that
// streams from the source through a physical slot, with hot_standby_feedback and, from
// PostgreSQL 17 on, sync_replication_slots, so it keeps copies of the source's failover slots.
type Standby struct {
	// Name is the standby cluster's name under the clusters' folder; Slot the physical slot it
	// streams through on the source (Name, lower-cased, - made _).
	Name, Slot string
	// AdminURL reaches the standby's postgres database.
	AdminURL     string
	script, root string
}

// NewStandby makes and starts standby name of the source cluster on PGCONVERGE_TEST_STANDBY_PORT
// (scripts/test.sh sets it, with PGCONVERGE_TEST_CLUSTER and PGCONVERGE_TEST_CLUSTER_ROOT); the
// test skips without them, or fails when PGCONVERGE_REQUIRE_INTEGRATION=1. At cleanup the standby
// (promoted or not) is stopped and removed, and its physical slot dropped on the source. The
// source cluster keeps running throughout: only one standby can exist at a time, so a test that
// makes one must not run in parallel with another that does.
func NewStandby(t *testing.T, name string) *Standby {
	t.Helper()
	script, root, port := os.Getenv("PGCONVERGE_TEST_CLUSTER"), os.Getenv("PGCONVERGE_TEST_CLUSTER_ROOT"), os.Getenv("PGCONVERGE_TEST_STANDBY_PORT")
	srcAdmin := os.Getenv("PGCONVERGE_TEST_SOURCE")
	if script == "" || root == "" || port == "" || srcAdmin == "" {
		if os.Getenv("PGCONVERGE_REQUIRE_INTEGRATION") == "1" {
			t.Fatal("PGCONVERGE_TEST_CLUSTER, PGCONVERGE_TEST_CLUSTER_ROOT or PGCONVERGE_TEST_STANDBY_PORT is not set: run the tests with scripts/test.sh")
		}
		t.Skip("standby test: run scripts/test.sh (PGCONVERGE_TEST_CLUSTER unset)")
	}
	u, err := url.Parse(srcAdmin)
	if err != nil {
		t.Fatalf("parse %s: %v", srcAdmin, err)
	}
	s := &Standby{Name: name, Slot: strings.ReplaceAll(strings.ToLower(name), "-", "_"), script: script, root: root}
	t.Cleanup(func() {
		if out, err := exec.Command(script, "stop", name, root).CombinedOutput(); err != nil {
			t.Errorf("stop standby %s: %v\n%s", name, err, out)
		}
		if err := os.RemoveAll(filepath.Join(root, name)); err != nil {
			t.Errorf("remove standby %s: %v", name, err)
		}
		ctx := context.Background()
		c, err := pgx.Connect(ctx, srcAdmin)
		if err != nil {
			t.Errorf("connect for cleanup: %v", err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, `select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = $1`, s.Slot); err != nil {
			t.Errorf("drop physical slot %s: %v", s.Slot, err)
		}
	})
	s.run(t, "standby", name, port, root, "source", u.Port())
	u.Host = u.Hostname() + ":" + port
	s.AdminURL = u.String()
	return s
}

// URL returns the URL of database db on the standby.
func (s *Standby) URL(t *testing.T, db string) string {
	t.Helper()
	u, err := url.Parse(s.AdminURL)
	if err != nil {
		t.Fatalf("parse %s: %v", s.AdminURL, err)
	}
	u.Path = "/" + db
	return u.String()
}

// Promote promotes the standby (pg_ctl promote -w): it leaves recovery on a new timeline and
// takes writes, a primary of its own; the source cluster is not touched.
func (s *Standby) Promote(t *testing.T) {
	t.Helper()
	s.run(t, "promote", s.Name, s.root)
}

func (s *Standby) run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(s.script, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(s.script), strings.Join(args, " "), err, out)
	}
}
