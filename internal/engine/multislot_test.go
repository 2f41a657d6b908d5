package engine_test

import (
	"fmt"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/operator"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// Two daemons with their own slots, publications and tables write into one target: each keeps
// its tables' loaded state and membership under its slot, so restarting either, or both, loads
// nothing again, and both streams go on converging.
func TestDaemonsOfTwoSlotsShareATarget(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `create table b (id int primary key, v text)`,
		`insert into a select g, 'a' from generate_series(1, 3000) g`, `insert into b select g, 'b' from generate_series(1, 3000) g`)
	cfgs := []Config{testConfig(t, env), testConfig(t, env)}
	for i, table := range []string{"public.a", "public.b"} {
		cfgs[i].Slot, cfgs[i].Publication, cfgs[i].Tables = env.Name+"_"+table[7:], env.Name+"_"+table[7:], []string{table}
	}
	daemons := []*pgtest.Running{startDaemon(t, cfgs[0]), startDaemon(t, cfgs[1])}
	change := func(step string) {
		t.Helper()
		pgtest.Exec(t, env.Source, `update a set v = '`+step+`' where id % 7 = 0`, `update b set v = '`+step+`' where id % 5 = 0`,
			`insert into a select max(id) + 1, '`+step+`' from a`, `delete from b where id = (select min(id) from b)`)
	}
	converge := func(step string) {
		t.Helper()
		change(step)
		pgtest.WaitConverged(t, env, "a", "id")
		pgtest.WaitConverged(t, env, "b", "id")
	}
	converge("first")
	runs := func() string {
		return pgtest.Scalar[string](t, env.Target, `select string_agg(coalesce(slot, '-') || ':' || trigger, ',' order by id) from pgconverge.backfill_runs`)
	}
	// The rows can all be in before a load completes (its key build, its ledger rows).
	pgtest.Eventually(t, 30*time.Second, "both initial loads completed", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_runs where status <> 'completed'`)
		return n == 0, fmt.Sprintf("%d runs not completed", n)
	})
	loaded := runs()
	for _, restart := range [][]int{{0}, {1}, {1, 0}} {
		for _, i := range restart {
			daemons[i].Stop(t)
		}
		change("stopped") // the stopped daemon's slot keeps these; the other streams them
		for _, i := range restart {
			daemons[i] = startDaemon(t, cfgs[i])
		}
		converge("restarted")
	}
	if got := runs(); got != loaded {
		t.Errorf("backfill runs after the restarts: %s, want only the initial loads %s", got, loaded)
	}
	got := pgtest.Rows(t, env.Target, `select table_name || ' ' || slot from pgconverge.tables order by 1`)
	want := []string{"a " + cfgs[0].Slot, "b " + cfgs[1].Slot}
	if d := pgtest.Diff(want, got); d != "" {
		t.Errorf("tables' slots: %s", d)
	}
	for _, c := range cfgs {
		rep, err := operator.CoverageReport(t.Context(), operator.CoverageConfig{Source: env.SourceURL, Target: env.TargetURL, Slot: c.Slot})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Covered {
			t.Errorf("coverage of slot %s: %+v", c.Slot, rep.Tables)
		}
	}
}
