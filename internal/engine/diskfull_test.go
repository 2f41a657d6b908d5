package engine_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// smallTablespace mounts a tmpfs of sizeMiB MiB, owned by the target cluster's OS user, and
// creates tablespace name on it; resize grows it. It skips the test where this process may not
// mount (not root). Undone at cleanup (the caller moves its tables out first).
func smallTablespace(t *testing.T, env *pgtest.Env, name string, sizeMiB int) (resize func(mib int)) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small filesystem needs root")
	}
	dir, err := os.MkdirTemp("", "pgconverge-full-")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm", sizeMiB), "tmpfs", dir).CombinedOutput(); err != nil {
		os.Remove(dir)
		t.Skipf("mount a tmpfs: %v: %s", err, out)
	}
	data := pgtest.Scalar[string](t, env.Target, `show data_directory`)
	st, err := os.Stat(data)
	if err != nil {
		t.Fatal(err)
	}
	owner := st.Sys().(*syscall.Stat_t)
	space := filepath.Join(dir, "space")
	if err := os.Mkdir(space, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(space, int(owner.Uid), int(owner.Gid)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, env.Target, `create tablespace `+name+` location '`+space+`'`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Connect(t, env.TargetURL), `drop tablespace if exists `+name)
		exec.Command("umount", dir).Run()
		os.Remove(dir)
	})
	return func(mib int) {
		if out, err := exec.Command("mount", "-o", fmt.Sprintf("remount,size=%dm", mib), dir).CombinedOutput(); err != nil {
			t.Fatalf("grow the tmpfs: %v: %s", err, out)
		}
	}
}

// A target disk that fills up stops the stream's writes with the server's error and the fix at
// ERROR, retried with backoff (reason resources) without exiting and without committing
// anything partial; once the disk has room again the same changes are applied and the tables
// converge, with no coverage gap.
func TestFullTargetDiskWaitsForSpace(t *testing.T) {
	t.Parallel() // the full filesystem is the test's own tmpfs, holding only its own tablespace
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `insert into a select g, 'v' from generate_series(1, 100) g`)
	resize := smallTablespace(t, env, env.Name+"_small", 4)
	cfg := testConfig(t, env)
	cfg.Knobs.RetryBackoffMax = 2 * time.Second // retried soon once the disk has room
	var logs pgtest.SyncBuffer
	cfg.Logger = newTestLogger(t, &logs)
	d := startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.WaitConverged(t, env, "a", "id")
	// The target table lives on the small filesystem from now on.
	pgtest.Exec(t, env.Target, `alter table a set tablespace `+env.Name+`_small`)
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Connect(t, env.TargetURL), `alter table a set tablespace pg_default`) })
	pgtest.Exec(t, env.Source, `insert into a select g, repeat(md5(g::text), 4) from generate_series(101, 60000) g`)
	pgtest.Eventually(t, 60*time.Second, "the full disk logged at ERROR with the fix", func() (bool, string) {
		l := logs.String()
		return strings.Contains(l, "No space left on device") && strings.Contains(l, "free space or grow the filesystem"), ""
	})
	d.RequireRunning(t)
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from a where id > 100`); n != 0 && n != 59900 {
		t.Errorf("%d of the 59,900 rows of one source transaction committed on a full disk, want none", n)
	}
	resize(64)
	pgtest.WaitConverged(t, env, "a", "id")
	d.RequireRunning(t)
	waitCovered(t, env)
}
