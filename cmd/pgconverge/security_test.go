package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// secret is the password the tests put in every URL; the test clusters trust local connections,
// so it is sent nowhere, but every path that could print a URL has it at hand.
const secret = "pw-S3cr3t-7f1d"

// withPassword returns u with password secret for its user.
func withPassword(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p.User = url.UserPassword(p.User.Username(), secret)
	return p.String()
}

// The password of a URL appears in no log line, error, report, metric or health answer: of a
// daemon that loads, streams and reconnects after its target sessions were ended, of every report
// command, and of failures to parse or reach a URL.
func TestPasswordsNeverShown(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	src, tgt := withPassword(t, env.SourceURL), withPassword(t, env.TargetURL)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `insert into a select g, 'v' from generate_series(1, 50) g`)
	var logs pgtest.SyncBuffer
	metrics := freeAddr(t)
	for i, format := range []string{"text", "json"} {
		d := pgtest.Start(t, func(ctx context.Context) error {
			return run(ctx, []string{"run", "--source", src, "--target", tgt, "--slot", env.Name, "--publication", env.Name,
				"--log-format", format, "--log-level", "debug", "--metrics-addr", metrics}, &logs, &logs)
		})
		pgtest.WaitStreaming(t, env)
		pgtest.Exec(t, env.Source, `insert into a values (1000 + `+fmt.Sprint(i)+`, 'streamed')`)
		pgtest.WaitConverged(t, env, "a", "id")
		// A lost target connection is logged with its error and retried.
		pgtest.Exec(t, env.Target, `select pg_terminate_backend(pid) from pg_stat_activity
where datname = current_database() and application_name = 'pgconverge' and pid <> pg_backend_pid()`)
		pgtest.WaitStreaming(t, env)
		for _, path := range []string{"/metrics", "/readyz", "/healthz"} {
			resp, err := http.Get("http://" + metrics + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			logs.Write(body)
		}
		d.Stop(t)
	}
	commands := [][]string{
		{"status", "--source", src, "--target", tgt, "--slot", env.Name},
		{"status", "--source", src, "--target", tgt, "--slot", env.Name, "--format", "json"},
		{"coverage", "--source", src, "--target", tgt, "--slot", env.Name, "--format", "json"},
		{"verify", "--source", src, "--target", tgt, "--log-format", "text", "--wait", "1s"},
		{"backfill", "--source", src, "--target", tgt, "--table", "public.a", "--log-format", "text"},
		// Failures: a port nothing listens on, a URL that does not parse, an unknown database.
		{"status", "--source", "postgres://postgres:" + secret + "@" + closedPort(t) + "/postgres", "--target", tgt},
		{"coverage", "--source", "postgres://postgres:" + secret + "@127.0.0.1:notaport/postgres", "--target", tgt},
		{"verify", "--source", src, "--target", strings.Replace(tgt, "/"+env.Name, "/no_such_db", 1)},
		{"run", "--source", "postgres://postgres:" + secret + "@" + closedPort(t) + "/postgres", "--target", tgt, "--log-format", "json"},
	}
	for _, args := range commands {
		var out pgtest.SyncBuffer
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		began := time.Now()
		err := run(ctx, args, &out, &out)
		t.Logf("%s: %s", strings.Join(args[:1], " "), time.Since(began).Round(time.Millisecond))
		cancel()
		fmt.Fprintf(&logs, "\n$ %s\n%s\nerror: %v\n", args[0], out.String(), err)
	}
	all := logs.String()
	if strings.Contains(all, secret) || strings.Contains(all, url.QueryEscape(secret)) {
		i := strings.Index(all, secret)
		t.Fatalf("the password appears in the output: …%s…", all[max(0, i-300):min(len(all), i+100)])
	}
	// The output is not empty: the commands ran, and their failures were reported.
	for _, want := range []string{"streaming", "pgconverge_rows_applied_total", "connection refused", "no_such_db"} {
		if !strings.Contains(all, want) {
			t.Errorf("the output lacks %q: the test did not exercise what it claims", want)
		}
	}
}
