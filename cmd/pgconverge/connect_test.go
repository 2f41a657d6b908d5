package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// closedPort returns a local TCP address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// unknownRole returns source with the user no_such_role and the default sslmode (prefer), so
// that a server without TLS refuses the TLS request before it refuses the role.
func unknownRole(t *testing.T, source string) string {
	t.Helper()
	u, err := url.Parse(source)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("no_such_role")
	q := u.Query()
	q.Del("sslmode")
	u.RawQuery = q.Encode()
	return u.String()
}

// A source or target that no server answers on the first start (a wrong port, an unknown host)
// stops `pgconverge run` at once with exit 5 and the fix, instead of retrying forever; a server
// that answers with a refusal (an unknown role) exits 1 with the server's own message first, not
// the refused TLS request that sslmode=prefer tried before it.
func TestRunFailsFastOnAServerItNeverReached(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	cases := []struct {
		name, source, target string
		code                 int
		want                 []string
	}{
		{"source port", "postgres://postgres@" + closedPort(t) + "/postgres", env.TargetURL, exitUnreachable,
			[]string{"connect to source 127.0.0.1:", "connection refused", "check the URL's host and port"}},
		{"target host", env.SourceURL, "postgres://postgres@no-such-host.invalid:5432/postgres", exitUnreachable,
			[]string{"connect to target no-such-host.invalid:5432/postgres", "check the URL's host and port"}},
		{"unknown role", unknownRole(t, env.SourceURL), env.TargetURL, 1,
			[]string{`connect to source`, `as "no_such_role": FATAL: role "no_such_role" does not exist (SQLSTATE 28000)`, "pg_hba.conf"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var stderr bytes.Buffer
			err := run(ctx, []string{"run", "--source", c.source, "--target", c.target, "--slot", env.Name,
				"--publication", env.Name, "--log-format", "text"}, &stderr, &stderr)
			if ctx.Err() != nil {
				t.Fatalf("run was still retrying after 30 s, want exit %d at once\n%s", c.code, stderr.String())
			}
			if got := exitCode(err); got != c.code {
				t.Fatalf("exit %d (%v), want %d", got, err, c.code)
			}
			if errors.Is(err, engine.ErrUnreachable) != (c.code == exitUnreachable) {
				t.Errorf("errors.Is(err, ErrUnreachable) = %v for exit %d", !(c.code == exitUnreachable), c.code)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "tls error") {
				t.Errorf("error %q mentions the refused TLS request", err)
			}
		})
	}
}
