package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// `pgconverge retire` turns a table left out of the selection from not-streamed (coverage
// --fail-on-gap exits 3) to retired (exit 0), and refuses a table a stream still follows.
func TestRetireCommand(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `create table b (id int primary key)`,
		`insert into a select generate_series(1, 10)`, `insert into b select generate_series(1, 10)`)
	d := startRun(t, env)
	pgtest.WaitConverged(t, env, "b", "id")
	d.Stop(t)
	d = startRun(t, env, "--tables", "a")
	pgtest.WaitStreaming(t, env)
	pgtest.Eventually(t, 60*time.Second, "b not-streamed", func() (bool, string) {
		rep, code := coverageOf(t, env)
		b, _ := rep.Table("public.b")
		return code == exitGap && b.Status == coverage.NotStreamed, string(b.Status)
	})
	var out bytes.Buffer
	err := run(context.Background(), []string{"retire", "--target", env.TargetURL, "--table", "a"}, &out, io.Discard)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "still follows") {
		t.Errorf("retire of a followed table: %v, want exit 1 and 'still follows'", err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"retire", "--target", env.TargetURL, "--table", "b"}, &out, io.Discard); err != nil {
		t.Fatalf("retire b: %v", err)
	}
	if out.String() != "retired public.b\n" {
		t.Errorf("retire printed %q", out.String())
	}
	rep, code := coverageOf(t, env)
	if b, _ := rep.Table("public.b"); code != 0 || b.Status != coverage.Retired {
		t.Errorf("after retire: exit %d, b %+v; want exit 0 and retired", code, b)
	}
	d.RequireRunning(t)
}
