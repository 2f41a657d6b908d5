package engine_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/internal/verify"
)

// appWriter inserts into ledger as the application's role until stopped, counting the inserts
// committed and those refused for want of the privilege (42501); any other error fails the test.
type appWriter struct {
	committed, denied atomic.Int64
	stop              context.CancelFunc
	done              sync.WaitGroup
}

func startAppWriter(t *testing.T, url string) *appWriter {
	t.Helper()
	conn := pgtest.Connect(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	w := &appWriter{stop: cancel}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		for ctx.Err() == nil {
			_, err := conn.Exec(ctx, `insert into ledger (acct, amount) values (1 + (random() * 99)::int, 1)`)
			var pgErr *pgconn.PgError
			switch {
			case err == nil:
				w.committed.Add(1)
			case errors.As(err, &pgErr) && pgErr.Code == "42501":
				w.denied.Add(1)
				time.Sleep(5 * time.Millisecond)
			case ctx.Err() == nil:
				t.Errorf("the application's insert: %v", err)
				return
			}
		}
	}()
	t.Cleanup(w.end)
	return w
}

func (w *appWriter) end() { w.stop(); w.done.Wait() }

// canWrite reports whether role (at url) may insert into ledger on the source now.
func canWrite(t *testing.T, url string) bool {
	t.Helper()
	conn := pgtest.Connect(t, url)
	defer conn.Close(context.Background())
	_, err := conn.Exec(context.Background(), `insert into ledger (acct, amount) values (1, 5)`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return false
	}
	if err != nil {
		t.Fatalf("insert as the application: %v", err)
	}
	return true
}

// cutover --pause-writes ROLE, with the application writing as ROLE all along: a failure at each
// step before the cutover is recorded (the run's context ended there, or a finalize that cannot
// work, found by the rehearsal) gives the writes back and cuts over nothing, the tables still
// replicated; the switchover that succeeds leaves the writes revoked, the target with every row
// the source committed and the source's schema, and reports how long the writes were paused.
func TestSwitchoverPausesTheApplicationsWrites(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	app := env.Name + "_app"
	pgtest.Exec(t, env.Source,
		`create function audit() returns trigger language plpgsql as $$ begin return new; end $$`,
		`create table acct (id serial primary key, name text not null default 'a')`,
		`create table ledger (id bigint generated always as identity primary key, acct int not null references acct,
		   amount int check (amount <> 0))`,
		`create index ledger_acct_idx on ledger (acct)`,
		`create trigger ledger_audit after insert on ledger for each row execute function audit()`,
		`insert into acct (name) select 'a' || g from generate_series(1, 100) g`,
		// A partitioned table: the rehearsal partitions it too, without moving its rows.
		`create table ev (id int, at date, primary key (id, at)) partition by range (at)`,
		`create table ev_1 partition of ev for values from ('2026-01-01') to ('2027-01-01')`,
		`insert into ev select g, date '2026-01-01' + g from generate_series(1, 50) g`)
	tempRole(t, env, true, app, "", `grant select, insert, update, delete on acct, ledger to `+app)
	appURL := withUser(t, env.SourceURL, app)
	cfg := testConfig(t, env)
	cfg.CopyIndexes = true
	d := startDaemon(t, cfg)
	w := startAppWriter(t, appURL)
	pgtest.WaitConverged(t, env, "acct", "id")
	pgtest.Eventually(t, 30*time.Second, "the application writing", func() (bool, string) { return w.committed.Load() > 50, "" })
	d.Stop(t)

	tablesReplicated := func(when string) {
		t.Helper()
		if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.cutovers`); n != 0 {
			t.Fatalf("%s: a cutover is recorded", when)
		}
		if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_attribute where attrelid = 'ledger'::regclass and attname = '_cdc_lsn'`); n != 1 {
			t.Fatalf("%s: the target table ledger was finalized", when)
		}
		if !canWrite(t, appURL) {
			t.Fatalf("%s: the application may not write on the source", when)
		}
	}
	// The trigger's function is missing on the target: the rehearsal finds it.
	rep, err := operator.Cutover(context.Background(), operator.CutoverConfig{Run: cfg, PauseWrites: app})
	if err == nil || !strings.Contains(err.Error(), "trigger ledger_audit") || !rep.WritesGivenBack {
		t.Fatalf("switchover with a trigger the target cannot create: %v, report %+v; want an error naming the trigger, the writes given back", err, rep)
	}
	tablesReplicated("after the failed rehearsal")
	pgtest.Exec(t, env.Target, `create function audit() returns trigger language plpgsql as $$ begin return new; end $$`)
	for _, step := range []string{"paused", "caught-up", "verified", "sequences", "rehearsed"} {
		ctx, cancel := context.WithCancel(context.Background())
		denied := w.denied.Load()
		ccfg := operator.CutoverConfig{Run: cfg, PauseWrites: app, AfterStep: func(s string) {
			if s == step {
				pgtest.Eventually(t, 10*time.Second, "the application's writes refused", func() (bool, string) { return w.denied.Load() > denied, "" })
				cancel()
			}
		}}
		rep, err := operator.Cutover(ctx, ccfg)
		cancel()
		if err == nil || !rep.WritesGivenBack {
			t.Fatalf("switchover ended after step %s: %v, report %+v; want an error and the writes given back", step, err, rep)
		}
		tablesReplicated("after step " + step)
	}
	committed := w.committed.Load()
	rep, err = operator.Cutover(context.Background(), operator.CutoverConfig{Run: cfg, PauseWrites: app})
	if err != nil {
		t.Fatalf("switchover: %v", err)
	}
	w.end()
	if rep.WritePauseSeconds <= 0 || rep.PausedRole != app || len(rep.Finalized) != 3 {
		t.Errorf("switchover report %+v; want a write pause, the role and 3 tables finalized", rep)
	}
	t.Logf("writes paused for %.2f s; the application committed %d inserts, %d refused", rep.WritePauseSeconds, w.committed.Load(), w.denied.Load())
	if w.committed.Load() <= committed {
		t.Error("the application wrote nothing between the failed switchovers")
	}
	if canWrite(t, appURL) {
		t.Error("the application may write on the source after the switchover")
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from ev_1`); n != 50 {
		t.Errorf("the target's partition ev_1 holds %d rows, want 50", n)
	}
	if r, err := operator.Cutover(context.Background(), operator.CutoverConfig{Run: cfg, ResumeWrites: true}); err != nil || r.WritesGivenBack {
		t.Errorf("cutover --resume-writes after the switchover: %v, %+v; want nothing given back", err, r)
	}
	if canWrite(t, appURL) {
		t.Error("cutover --resume-writes gave back the writes of a switchover that cut over")
	}
	if d := pgtest.Diff(pgtest.Rows(t, env.Source, `select row(l.*)::text from ledger l order by id`),
		pgtest.Rows(t, env.Target, `select row(l.*)::text from ledger l order by id`)); d != "" {
		t.Errorf("the target's ledger differs from the source's:\n%s", d)
	}
	srep, err := verify.Schema(context.Background(), verify.Config{Source: env.SourceURL, Target: env.TargetURL})
	if err != nil || srep.Differences != 0 {
		t.Errorf("verify --schema after the switchover: %v, %s", err, schemaKinds(srep, true))
	}
	if o := pgtest.Scalar[string](t, env.Target, `select outcome from pgconverge.write_pauses`); o != "cut over" {
		t.Errorf("write pause outcome %q, want 'cut over'", o)
	}
	var next int64
	if err := env.Target.QueryRow(context.Background(), `insert into ledger (acct, amount) values (1, 1) returning id`).Scan(&next); err != nil ||
		next <= pgtest.Scalar[int64](t, env.Source, `select max(id) from ledger`) {
		t.Errorf("the target's identity handed out %d (%v), which the source handed out already", next, err)
	}
}
