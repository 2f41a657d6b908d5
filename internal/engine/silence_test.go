package engine_test

import (
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// behindSourceProxy returns a test environment whose source holds table a (one row), a proxy to
// its source, and a daemon configuration that reaches the source through the proxy and logs into
// logs.
func behindSourceProxy(t *testing.T) (*pgtest.Env, *tcpProxy, Config, *pgtest.SyncBuffer) {
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `insert into a values (1, 'one')`)
	src, _ := url.Parse(env.SourceURL)
	proxy := newProxy(t, src.Host)
	cfg := testConfig(t, env)
	logs := &pgtest.SyncBuffer{}
	cfg.Logger = newTestLogger(t, logs)
	cfg.Source = proxy.url(t, env.SourceURL)
	return env, proxy, cfg, logs
}

// A replication connection that goes silent without an error (a network dropping packets: the
// proxy forwards nothing and closes nothing) is given up after three status intervals of waiting,
// logged with the fix, and the next session reconnects and streams on.
func TestSilentSourceIsReconnected(t *testing.T) {
	t.Parallel()
	env, proxy, cfg, logs := behindSourceProxy(t)
	cfg.Knobs.StatusInterval = time.Second
	d := startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	// A change applied: the stream's receive loop runs (the session's start is behind it).
	pgtest.Exec(t, env.Source, `insert into a values (0, 'zero')`)
	pgtest.WaitConverged(t, env, "a", "id")
	proxy.frozen.Store(true)
	pgtest.Eventually(t, 30*time.Second, "the silent source logged", func() (bool, string) {
		return strings.Contains(logs.String(), "the source went silent: nothing for") &&
			strings.Contains(logs.String(), "the replication connection went silent without an error"), ""
	})
	proxy.frozen.Store(false)
	pgtest.Exec(t, env.Source, `insert into a values (2, 'after')`, `update a set v = 'uno' where id = 1`)
	pgtest.WaitConverged(t, env, "a", "id")
	d.RequireRunning(t)
}

// A source that stops answering while a session starts (the proxy forwards nothing from the
// moment the session's checks begin) fails that session's checks at the catalog deadline, logged
// with what did not answer, instead of holding the daemon forever; once the network is back, the
// next session starts and streams.
func TestFrozenSourceAtSessionStartIsRetried(t *testing.T) {
	t.Parallel()
	env, proxy, cfg, logs := behindSourceProxy(t)
	cfg.Knobs.StatementTimeout = 2 * time.Second
	var froze sync.Once
	cfg.Knobs.BeforePreflight = func() { froze.Do(func() { proxy.frozen.Store(true) }) }
	d := startDaemon(t, cfg)
	pgtest.Eventually(t, 30*time.Second, "the frozen session start logged", func() (bool, string) {
		return strings.Contains(logs.String(), "the source gave no answer to a statement within 2s"), ""
	})
	proxy.frozen.Store(false)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `insert into a values (2, 'after')`)
	pgtest.WaitConverged(t, env, "a", "id")
	d.RequireRunning(t)
}
