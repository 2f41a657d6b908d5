package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// startRun runs `pgconverge run` for the test's databases (slot and publication named after the
// test, 1,000-row chunks) with extra flags; it is stopped, as by SIGTERM, at cleanup at the latest.
func startRun(t *testing.T, env *pgtest.Env, extra ...string) *pgtest.Running {
	t.Helper()
	args := append([]string{"run", "--source", env.SourceURL, "--target", env.TargetURL, "--slot", env.Name,
		"--publication", env.Name, "--chunk-rows", "1000", "--log-format", "text"}, extra...)
	return pgtest.Start(t, func(ctx context.Context) error { return run(ctx, args, io.Discard, pgtest.LogWriter(t)) })
}

// coverageOf runs `pgconverge coverage --format json --fail-on-gap` for the test's databases and
// returns the report and the exit status the process would have.
func coverageOf(t *testing.T, env *pgtest.Env) (coverage.Report, int) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"coverage", "--source", env.SourceURL, "--target", env.TargetURL,
		"--slot", env.Name, "--format", "json", "--fail-on-gap"}, &out, &errb)
	code := exitCode(err)
	if code == 1 {
		t.Fatalf("coverage: %v", err)
	}
	var rep coverage.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("coverage JSON: %v\n%s", err, out.String())
	}
	return rep, code
}

// waitCovered polls `pgconverge coverage --fail-on-gap` until it exits 0 and returns its report.
func waitCovered(t *testing.T, env *pgtest.Env) coverage.Report {
	t.Helper()
	var rep coverage.Report
	pgtest.Eventually(t, 60*time.Second, "coverage without gaps", func() (bool, string) {
		var code int
		rep, code = coverageOf(t, env)
		return code == 0 && rep.Covered, fmt.Sprintf("exit %d: %+v", code, rep.Tables)
	})
	return rep
}

// `pgconverge coverage --fail-on-gap` exits 0 on a covered target and 3, with the gap in its JSON
// and the table format, once the daemon's slot was dropped and the source written.
func TestCoverageCommand(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `insert into a select generate_series(1, 10)`)
	d := startRun(t, env)
	pgtest.WaitStreaming(t, env)
	pgtest.WaitSlotCaughtUp(t, env)
	if tr, ok := waitCovered(t, env).Table("public.a"); !ok || tr.Status != coverage.Covered {
		t.Fatalf("coverage of public.a: %+v", tr)
	}
	d.Stop(t)
	pgtest.Eventually(t, 30*time.Second, "slot dropped", func() (bool, string) {
		_, err := env.Source.Exec(context.Background(), `select pg_drop_replication_slot($1)`, env.Name)
		return err == nil, fmt.Sprint(err)
	})
	pgtest.Exec(t, env.Source, `insert into a values (11)`) // no slot keeps this change
	rep, code := coverageOf(t, env)
	if tr, _ := rep.Table("public.a"); code != exitGap || tr.Status != "gap" || len(tr.Gaps) == 0 {
		t.Errorf("coverage after the slot was dropped: exit %d, %+v; want exit %d and a gap", code, tr, exitGap)
	}
	var table bytes.Buffer
	err := run(context.Background(), []string{"coverage", "--source", env.SourceURL, "--target", env.TargetURL, "--fail-on-gap"}, &table, io.Discard)
	if exitCode(err) != exitGap || !strings.Contains(table.String(), "not covered: public.a (gap)") {
		t.Errorf("coverage table: %v\n%s", err, table.String())
	}
}

// An interrupted `pgconverge backfill` exits with an error, also before its run started.
func TestInterruptedBackfillFails(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := run(ctx, []string{"backfill", "--source", env.SourceURL, "--target", env.TargetURL, "--table", "public.x", "--log-format", "json"}, io.Discard, io.Discard)
	if err == nil {
		t.Fatal("interrupted backfill succeeded, want an error")
	}
}

// Names that need quoting everywhere — a schema with a space, a table with double quotes, another
// with a comma, one whose schema and name hold a semicolon, a backslash, a quote and a newline,
// columns in mixed case, with a space, a reserved word, a non-ASCII letter, SQL-looking text and
// a newline — pass through --tables, the stream, backfills, verify, the coverage report and the
// metrics labels.
func TestQuotedNamesEverywhere(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	const items, comma = `"Sales Dept"."Order ""Items"""`, `"Sales Dept"."a,b"`
	const odd = `"x; drop schema public --\"."t'1;` + "\n" + `""x"""`
	pgtest.Exec(t, env.Source, `create schema "Sales Dept"`,
		`create table `+items+` ("OrderId" int, "line no" int, "select" text, "prix€" numeric, primary key ("OrderId", "line no"))`,
		`create table `+comma+` ("Key" text primary key)`,
		`insert into `+items+` select g / 3, g % 3, 'sel ' || g, g * 1.5 from generate_series(1, 30) g`,
		`insert into `+comma+` values ('x'), ('y')`,
		`create schema "x; drop schema public --\"`,
		`create table `+odd+` ("k;'\" int primary key, "v`+"\n"+`""); --" text)`,
		`insert into `+odd+` select g, 'v' || g from generate_series(1, 5) g`)
	metrics := freeAddr(t)
	startRun(t, env, "--tables", items+", "+comma+", "+odd, "--metrics-addr", metrics)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `update `+items+` set "select" = 'upd', "prix€" = -1 where "line no" = 0`,
		`update `+items+` set "OrderId" = "OrderId" + 100 where "OrderId" = 1`, `delete from `+items+` where "OrderId" = 2`,
		`insert into `+comma+` values ('z')`,
		`update `+odd+` set "v`+"\n"+`""); --" = 'w' where "k;'\" = 2`, `delete from `+odd+` where "k;'\" = 3`,
		`insert into `+odd+` values (6, 'six')`)
	pgtest.WaitConverged(t, env, items, `"OrderId", "line no"`)
	pgtest.WaitConverged(t, env, comma, `"Key"`)
	pgtest.WaitConverged(t, env, odd, `"k;'\"`)
	var vout bytes.Buffer
	if err := run(context.Background(), []string{"verify", "--source", env.SourceURL, "--target", env.TargetURL,
		"--table", odd, "--format", "json"}, &vout, io.Discard); err != nil {
		t.Errorf("verify of %s: %v\n%s", odd, err, vout.String())
	}
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_namespace where nspname = 'public'`); n != 1 {
		t.Fatalf("schema public is gone: a name was run as SQL")
	}

	rep := waitCovered(t, env)
	for _, name := range []string{items, comma, odd} {
		if tr, _ := rep.Table(name); tr.Status != coverage.Covered {
			t.Errorf("coverage of %s: %s", name, tr.Status)
		}
	}
	var table bytes.Buffer
	if err := run(context.Background(), []string{"coverage", "--source", env.SourceURL, "--target", env.TargetURL,
		"--slot", env.Name}, &table, &bytes.Buffer{}); err != nil {
		t.Fatalf("coverage: %v", err)
	}
	if !strings.Contains(table.String(), items) || !strings.Contains(table.String(), comma) {
		t.Errorf("coverage table does not name the tables as %s and %s:\n%s", items, comma, table.String())
	}

	label := func(name string) string { return strings.ReplaceAll(name, `"`, `\"`) }
	want := map[string]string{
		`pgconverge_rows_applied_total{path="backfill",table="` + label(items) + `"}`: "30",
		`pgconverge_rows_applied_total{path="backfill",table="` + label(comma) + `"}`: "2",
		`pgconverge_rows_applied_total{path="stream",table="` + label(comma) + `"}`:   "1",
		`pgconverge_coverage_gap_bytes{table="` + label(items) + `"}`:                 "0",
	}
	pgtest.Eventually(t, 30*time.Second, "metrics with quoted table labels", func() (bool, string) {
		got := scrape(t, metrics)
		for k, v := range want {
			if got[k] != v {
				return false, fmt.Sprintf("%s = %q, want %q", k, got[k], v)
			}
		}
		return true, ""
	})
}
