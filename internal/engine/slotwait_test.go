package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// slotWaits is a Monitor that keeps the slot creation waits it is told of.
type slotWaits struct {
	NopMonitor
	mu    sync.Mutex
	waits []pgsession.SlotWait
}

func (m *slotWaits) SlotCreationWait(_ string, w pgsession.SlotWait) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.waits = append(m.waits, w)
}

func (m *slotWaits) last() (pgsession.SlotWait, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.waits) == 0 {
		return pgsession.SlotWait{}, 0
	}
	return m.waits[len(m.waits)-1], len(m.waits)
}

// A transaction open on the source when the daemon creates its slot holds the creation up: the
// daemon keeps waiting, tells (log, Monitor) which backend it waits for, and status shows it;
// once the transaction ends the slot is created and the table converges.
func TestSlotCreationNamesTheTransactionItWaitsFor(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key)`, `insert into t select generate_series(1, 10)`)
	holder := pgtest.Connect(t, env.SourceURL)
	pgtest.Exec(t, holder, `set application_name = 'nightly-job'`, `begin`, `insert into t values (100)`)
	pid := pgtest.Scalar[int32](t, holder, `select pg_backend_pid()`)
	mon := &slotWaits{}
	cfg := testConfig(t, env)
	cfg.Monitor = mon
	startDaemon(t, cfg)
	blockedBy := func(bs []pgsession.Blocker) bool {
		return slices.ContainsFunc(bs, func(b pgsession.Blocker) bool { return b.PID == pid && b.Application == "nightly-job" })
	}
	pgtest.Eventually(t, 30*time.Second, "the slot creation's wait reported with the open transaction", func() (bool, string) {
		w, n := mon.last()
		return blockedBy(w.Blockers), fmt.Sprintf("%d reports, last %+v", n, w)
	})
	// Status shows every creation on the cluster: the transaction holds up the slots of tests
	// running alongside too, for the few seconds it stays open.
	st, err := operator.Status(context.Background(), operator.StatusConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: cfg.Slot})
	if err != nil || !slices.ContainsFunc(st.SlotCreations, func(c operator.SlotCreation) bool {
		return strings.Contains(c.Command, cfg.Slot) && blockedBy(c.Blockers)
	}) {
		t.Errorf("status while the slot's creation waits: %v, %+v; want it with the open transaction", err, st.SlotCreations)
	}
	pgtest.Exec(t, holder, `commit`)
	pgtest.WaitConverged(t, env, "t", "id")
	if w, _ := mon.last(); w.Waited != 0 || len(w.Blockers) != 0 {
		t.Errorf("last report after the slot was created: %+v, want the wait's end", w)
	}
}
