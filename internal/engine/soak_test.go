package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/verify"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// envSoak sets TestSoak's duration (a Go duration; default 40s); scripts/soak.sh sets it.
// envSoakChild makes the crash child a soak daemon: scheduled backfills and verifies with repair.
// envSoakSummary names a file the summary line is written to.
const (
	envSoak        = "PGCONVERGE_SOAK"
	envSoakChild   = "PGCONVERGE_SOAK_CHILD"
	envSoakSummary = "PGCONVERGE_SOAK_SUMMARY"
)

// tcpProxy forwards each connection to its local address to target; cut closes every
// connection open through it, both sides at once, as a network failure would, and while frozen
// it forwards nothing and closes nothing, as a network dropping packets would.
type tcpProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	frozen atomic.Bool
}

// newProxy listens on a free loopback port until the test ends.
func newProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go p.serve()
	return p
}

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				for p.frozen.Load() {
					time.Sleep(20 * time.Millisecond)
				}
				if n > 0 {
					if _, werr := dst.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		go pipe(up, c)
		go pipe(c, up)
	}
}

// cut closes every open connection and returns how many client connections it cut.
func (p *tcpProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	n := len(p.conns) / 2
	clear(p.conns)
	return n
}

// url returns u with the proxy's address as its host and port.
func (p *tcpProxy) url(t *testing.T, u string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	parsed.Host = p.ln.Addr().String()
	return parsed.String()
}

// soakWorkload runs the crash tests' workload transactions on the source until stop is called,
// reconnecting after the source restarts; stop returns how many committed.
func soakWorkload(t *testing.T, env *pgtest.Env) (stop func() int64) {
	var done atomic.Bool
	var committed atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx := context.Background()
		var conn *pgx.Conn
		for i := 1; !done.Load(); i++ {
			if conn == nil || conn.IsClosed() {
				var err error
				if conn, err = pgx.Connect(ctx, env.SourceURL); err != nil {
					time.Sleep(100 * time.Millisecond) // the source restarts
					continue
				}
			}
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return workloadTxn(ctx, tx, i) })
			if err == nil {
				committed.Add(1)
			} else if !conn.IsClosed() {
				conn.Close(ctx)
			}
		}
		if conn != nil {
			conn.Close(ctx)
		}
	}()
	var once sync.Once
	stop = func() int64 { once.Do(func() { done.Store(true); wg.Wait() }); return committed.Load() }
	t.Cleanup(func() { stop() })
	return stop
}

// soakDaemon is the daemon under test: a child process (so that a SIGKILL is real) streaming
// through the proxies, with scheduled backfills and verifies with repair.
type soakDaemon struct {
	t        *testing.T
	env      *pgtest.Env
	src, tgt string
	cmd      *exec.Cmd
	out      *pgtest.SyncBuffer
}

func (d *soakDaemon) start() {
	fmt.Fprintf(d.out, "===== daemon started %s\n", time.Now().Format(time.RFC3339Nano))
	d.cmd = exec.Command(os.Args[0], "-test.run=^$")
	d.cmd.Env = append(os.Environ(), envCrashPoint+"=none", envCrashAt+"=0", envSoakChild+"=1",
		envCrashSrc+"="+d.src, envCrashTgt+"="+d.tgt, envCrashSlot+"="+d.env.Name)
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
}

func (d *soakDaemon) kill() {
	d.cmd.Process.Signal(syscall.SIGKILL)
	d.cmd.Wait()
}

// Faults cost time, never data: under a workload, with the daemon streaming through TCP proxies
// and running scheduled backfills and verifies with repair, and a process joining each backfill run
// (backfill --join), faults are injected at random moments for PGCONVERGE_SOAK (default 40 s):
// SIGKILL of the daemon, of a manual backfill and of the joined process, fast and immediate
// (crash) restarts of the source, restarts of the target, connections cut on either side, the
// target's statements cancelled (as by a statement_timeout), and a deadlock the daemon's waiting
// write transaction loses against a target session (injectDeadlock). Afterwards both tables
// equal the source, verify finds nothing and never found anything, coverage has no gap, no stream
// segment ended, and the daemon still runs; the faults of each kind are printed.
func TestSoak(t *testing.T) {
	dur := 40 * time.Second
	if v := os.Getenv(envSoak); v != "" {
		var err error
		if dur, err = time.ParseDuration(v); err != nil {
			t.Fatalf("%s=%q: %v", envSoak, v, err)
		}
	}
	env := pgtest.New(t)
	setupCrashTables(t, env)
	srcURL, _ := url.Parse(env.SourceURL)
	tgtURL, _ := url.Parse(env.TargetURL)
	srcProxy, tgtProxy := newProxy(t, srcURL.Host), newProxy(t, tgtURL.Host)
	d := &soakDaemon{t: t, env: env, src: srcProxy.url(t, env.SourceURL), tgt: tgtProxy.url(t, env.TargetURL), out: &pgtest.SyncBuffer{}}
	d.start()
	t.Cleanup(d.kill)
	t.Cleanup(func() {
		if t.Failed() {
			log := d.out.String()
			t.Logf("the daemon's output (last 20,000 bytes):\n%s", log[max(0, len(log)-20000):])
		}
	})
	pgtest.WaitStreaming(t, env)
	j := &soakJoiner{t: t, src: d.src, tgt: d.tgt, out: &pgtest.SyncBuffer{}}
	j.start()
	t.Cleanup(j.kill)
	t.Cleanup(func() {
		if t.Failed() {
			log := j.out.String()
			t.Logf("the joined worker's output (last 5,000 bytes):\n%s", log[max(0, len(log)-5000):])
		}
	})
	stopWorkload := soakWorkload(t, env)

	seed := time.Now().UnixNano()
	rnd := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("soak for %s, random seed %d", dur, seed)
	kinds := []string{"kill daemon", "kill backfill", "restart source (fast)", "restart source (crash)", "restart target",
		"cut source connections", "cut target connections", "cancel target statements", "kill joined backfill worker", "deadlock"}
	injected := map[string]int{}
	deadlocks := 0
	var backfills []*exec.Cmd
	for deadline := time.Now().Add(dur); time.Now().Before(deadline); {
		time.Sleep(time.Duration(500+rnd.IntN(2500)) * time.Millisecond) // the moment is the point
		kind := kinds[rnd.IntN(len(kinds))]
		switch kind {
		case "kill daemon":
			d.kill()
			d.start()
		case "kill backfill":
			b := exec.Command(os.Args[0], "-test.run=^$")
			b.Env = append(os.Environ(), envCrashPoint+"=backfill-chunk", envCrashAt+"="+fmt.Sprint(1+rnd.IntN(4)),
				envCrashSrc+"="+env.SourceURL, envCrashTgt+"="+env.TargetURL, "PGCONVERGE_CRASH_TABLES=public.ledger,public.acct")
			if err := b.Start(); err != nil {
				t.Fatal(err)
			}
			backfills = append(backfills, b)
		case "restart source (fast)":
			pgtest.RestartMode(t, "source", "fast")
		case "restart source (crash)":
			pgtest.RestartMode(t, "source", "immediate")
		case "restart target":
			pgtest.Restart(t, "target")
		case "cut source connections":
			srcProxy.cut()
		case "cut target connections":
			tgtProxy.cut()
		case "kill joined backfill worker":
			j.kill()
			j.start()
		case "deadlock":
			if injectDeadlock(t, env.TargetURL) {
				deadlocks++
			}
		case "cancel target statements":
			pgtest.Exec(t, pgtest.Connect(t, env.TargetURL), `select pg_cancel_backend(pid) from pg_stat_activity
where datname = current_database() and application_name = 'pgconverge' and state = 'active' and pid <> pg_backend_pid()`)
		}
		injected[kind]++
	}
	// The test's own sessions did not survive the restarts.
	env.Source, env.Target = pgtest.Connect(t, env.SourceURL), pgtest.Connect(t, env.TargetURL)
	killedBackfills := 0
	for _, b := range backfills {
		if err := b.Wait(); err != nil && strings.Contains(err.Error(), "killed") {
			killedBackfills++
		}
	}
	committed := stopWorkload()
	if err := d.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the daemon exited: %v\n%s", err, d.out)
	}
	// After a burst of faults the daemon's backoff may be at its 30 s ceiling and a session start
	// may wait for its slot: give it time to catch up before the 60 s convergence checks.
	end := pgtest.Scalar[string](t, env.Source, `select pg_current_wal_insert_lsn()::text`)
	pgtest.Eventually(t, 4*time.Minute, "the daemon applied the workload", func() (bool, string) {
		var caught bool
		err := env.Target.QueryRow(context.Background(), `select coalesce((select applied_lsn >= $1::pg_lsn from pgconverge.progress where slot = $2), false)`,
			end, env.Name).Scan(&caught)
		return err == nil && caught, fmt.Sprint(err)
	})
	requireWorkloadConverged(t, env)
	rep, err := verify.Run(t.Context(), verify.Config{Source: env.SourceURL, Target: env.TargetURL, Logger: testConfig(t, env).Logger})
	if err != nil || rep.Found != 0 {
		t.Errorf("verify after the soak: %+v, %v; want nothing found", rep, err)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.discrepancies`); n != 0 {
		t.Errorf("%d discrepancies recorded by the scheduled verifies during the soak, want none", n)
	}
	if err := d.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the daemon exited: %v\n%s", err, d.out)
	}
	log := d.out.String()
	var summary []string
	for _, k := range kinds {
		summary = append(summary, fmt.Sprintf("%s %d", k, injected[k]))
	}
	slices.Sort(summary)
	total := 0
	for _, n := range injected {
		total += n
	}
	rows := pgtest.Scalar[int64](t, env.Source, `select (select count(*) from acct) + (select count(*) from ledger)`)
	line := fmt.Sprintf("soak summary: %d faults injected in %s and survived (%s); deadlock cycles closed %d; manual backfills killed mid-run %d of %d; "+
		"source transactions committed %d; %d rows verified equal; the daemon retried %d deadlocks and %d serialization failures; "+
		"rows applied by the joined worker %d; scheduled backfills %d, scheduled verifies %d",
		total, dur, strings.Join(summary, ", "), deadlocks, killedBackfills, len(backfills), committed, rows,
		strings.Count(log, "40P01"), strings.Count(log, "40001"), joinedRows(log),
		pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_runs where trigger = 'schedule' and status = 'completed'`),
		pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.verify_runs where status = 'completed'`))
	t.Log(line)
	if f := os.Getenv(envSoakSummary); f != "" {
		if err := os.WriteFile(f, []byte(line+"\n"), 0o644); err != nil {
			t.Error(err)
		}
	}
}
