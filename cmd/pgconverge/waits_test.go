package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// `pgconverge status` and `pgconverge coverage`, in both formats, name the table a daemon leaves
// to the running daemon of another slot, the slot that waits for it and the slot that follows it,
// while the waiting daemon streams its other table.
func TestStatusAndCoverageNameTheWaitingSlot(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table b (id int primary key)`, `insert into b select generate_series(1, 100)`,
		`create table c (id int primary key)`, `insert into c select generate_series(1, 100)`)
	startRun(t, env, "--tables", "public.b")
	pgtest.WaitConverged(t, env, "b", "id")
	waiter := env.Name + "_2"
	startRun(t, env, "--slot", waiter, "--publication", waiter, "--tables", "public.b,public.c")
	pgtest.WaitConverged(t, env, "c", "id")
	line := fmt.Sprintf("slot %s waits for table public.b: followed by the running daemon of slot %s", waiter, env.Name)
	pgtest.Eventually(t, 30*time.Second, "status names the wait", func() (bool, string) {
		out := statusTable(t, env)
		return strings.Contains(out, line), out
	})
	var out bytes.Buffer
	if err := run(context.Background(), []string{"coverage", "--source", env.SourceURL, "--target", env.TargetURL, "--slot", env.Name}, &out, io.Discard); err != nil {
		t.Fatalf("coverage: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), line) {
		t.Errorf("coverage's table format lacks %q:\n%s", line, out.String())
	}
	rep, raw := statusOf(t, env)
	if len(rep.Waiting) != 1 || rep.Waiting[0].Slot != waiter || rep.Waiting[0].Table != "public.b" || rep.Waiting[0].FollowedBy != env.Name {
		t.Errorf("status JSON waiting: %+v, want %s waiting for public.b followed by %s", rep.Waiting, waiter, env.Name)
	}
	requireKeys(t, "status waiting[0]", first(t, raw, "waiting"), "slot", "table", "followed_by", "since")
	cov, _ := coverageOf(t, env)
	if len(cov.Waiting) != 1 || cov.Waiting[0] != rep.Waiting[0] {
		t.Errorf("coverage JSON waiting: %+v, want %+v", cov.Waiting, rep.Waiting)
	}
}
