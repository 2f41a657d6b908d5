package engine_test

import (
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// A source or a target whose network freezes while a session starts (the proxy in front of it
// forwards nothing, in either direction, from the moment a step of the start begins, and closes
// nothing) fails the statement that waits for it at the statement deadline instead of holding
// the session forever: the session ends, logged at ERROR with the server that did not answer and
// the fix, and is retried with backoff, counted as reason "timeout"; once the network forwards
// again, the daemon streams on and the target equals the source.
func TestFrozenNetworkDuringSessionStartIsRetried(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ side, step string }{
		{"source", "publication"}, // the publication and its memberships
		{"source", "slot"},        // the slot's reads
		{"source", "stream"},      // the stream's setup, before the receive loop
		{"target", "lead"},        // the metadata schema, the leader lock and epoch
		{"target", "slot"},        // the ledger's bookkeeping
	} {
		t.Run(c.side+"_"+c.step, func(t *testing.T) {
			t.Parallel() // each case has its own databases and slot
			env := pgtest.New(t)
			pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `insert into a values (1, 'one')`)
			server := env.SourceURL
			if c.side == "target" {
				server = env.TargetURL
			}
			u, _ := url.Parse(server)
			proxy := newProxy(t, u.Host)
			cfg := testConfig(t, env)
			logs := &pgtest.SyncBuffer{}
			cfg.Logger = newTestLogger(t, logs)
			mon := &retryCounter{}
			cfg.Monitor = mon
			if c.side == "target" {
				cfg.Target = proxy.url(t, env.TargetURL)
			} else {
				cfg.Source = proxy.url(t, env.SourceURL)
			}
			cfg.Knobs.StatementTimeout = 2 * time.Second
			var froze sync.Once
			cfg.Knobs.BeforeStep = func(step string) {
				if step == c.step {
					froze.Do(func() { proxy.frozen.Store(true) })
				}
			}
			d := startDaemon(t, cfg)
			want := fmt.Sprintf("the %s gave no answer to a statement within 2s", c.side)
			pgtest.Eventually(t, 60*time.Second, "the frozen session start retried as a timeout", func() (bool, string) {
				return mon.counts()["timeout"] > 0 && strings.Contains(logs.String(), want), fmt.Sprintf("retries %v", mon.counts())
			})
			proxy.frozen.Store(false)
			pgtest.WaitStreaming(t, env)
			pgtest.Exec(t, env.Source, `insert into a values (2, 'after')`, `update a set v = 'uno' where id = 1`)
			pgtest.WaitConverged(t, env, "a", "id")
			d.RequireRunning(t)
		})
	}
}

// A source whose network freezes while the daemon streams fails the watcher's next read (the WAL
// position every second, the catalog checks every 5 s) at the statement deadline, well before the
// replication connection is given up as silent: the session is retried as a "timeout" and streams
// on once the network forwards again.
func TestFrozenSourceWhileStreamingFailsTheWatcher(t *testing.T) {
	t.Parallel()
	env, proxy, cfg, logs := behindSourceProxy(t)
	mon := &retryCounter{}
	cfg.Monitor = mon
	cfg.Knobs.StatementTimeout = 2 * time.Second
	d := startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `insert into a values (0, 'zero')`)
	pgtest.WaitConverged(t, env, "a", "id")
	proxy.frozen.Store(true)
	pgtest.Eventually(t, 20*time.Second, "the frozen watcher retried as a timeout", func() (bool, string) {
		return mon.counts()["timeout"] > 0 && strings.Contains(logs.String(), "watch the source"), fmt.Sprintf("retries %v", mon.counts())
	})
	proxy.frozen.Store(false)
	pgtest.Exec(t, env.Source, `insert into a values (2, 'after')`, `update a set v = 'uno' where id = 1`)
	pgtest.WaitConverged(t, env, "a", "id")
	d.RequireRunning(t)
}
