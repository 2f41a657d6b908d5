// Package lease holds the timings and the identity under which pgconverge processes show each
// other on the target that they are alive, and the lease of backfill processes' target sessions:
// a process silent past Term is taken for dead, and its sessions may be ended (a lease, as in
// Gray and Cheriton, "Leases: an efficient fault-tolerant mechanism for distributed file cache
// consistency", SOSP 1989). The slot's leader lock (apply.LockLeader) and the backfill processes'
// heartbeats (coverage.Heartbeat) are renewed every CheckEvery under the same Term.
package lease

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"
)

// CheckEvery is how often a process renews what shows it alive (a leader checks its lock
// connection, a backfill process records its sessions) and how often watchers look for silent
// processes; each check must answer within CheckTimeout. Term is how long a silent process keeps
// what it holds: a standby ends a leader lock holder's session silent that long (a frozen
// process, or a network that broke without resetting the connection), a new leader lets the old
// one's transactions hold off its epoch raise that long, and backfill processes silent that long
// lose their sessions.
const (
	CheckEvery   = 2 * time.Second
	CheckTimeout = 5 * time.Second
	Term         = 15 * time.Second
)

// Timings are the lease's durations a process runs on: CheckEvery, CheckTimeout and Term, as the
// constants of the same names describe them. Production uses Default; tests that wait for a
// lease to run out set shorter ones (engine.Knobs.Lease, backfillrun.Job.Lease and
// backfillrun.JoinConfig.Lease), the same for every process of the test.
type Timings struct {
	CheckEvery, CheckTimeout, Term time.Duration
}

// Default returns the production timings: CheckEvery, CheckTimeout and Term.
func Default() Timings {
	return Timings{CheckEvery: CheckEvery, CheckTimeout: CheckTimeout, Term: Term}
}

// OrDefault returns t with each unset (zero or negative) duration replaced by Default's.
func (t Timings) OrDefault() Timings {
	d := Default()
	if t.CheckEvery <= 0 {
		t.CheckEvery = d.CheckEvery
	}
	if t.CheckTimeout <= 0 {
		t.CheckTimeout = d.CheckTimeout
	}
	if t.Term <= 0 {
		t.Term = d.Term
	}
	return t
}

// Holder names this process in pgconverge.leaders, in the backfill processes' heartbeats and in
// other processes' logs: host and pid, as "host pid 123".
func Holder() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown host"
	}
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}

// Every runs fn every d on its own goroutine until stop, which waits for a running fn to end. fn
// gets a context that stop cancels.
func Every(ctx context.Context, d time.Duration, fn func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fn(ctx)
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}
