package engine_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// Tests of what a source's applications and DBAs, or a target's operator, may do while the daemon
// runs: none of it may stop the daemon, make the source application fail, or lose a row.

// retryCounter is a Monitor that counts session retries by reason.
type retryCounter struct {
	NopMonitor
	mu sync.Mutex
	n  map[string]int
}

func (m *retryCounter) SessionRetried(reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == nil {
		m.n = map[string]int{}
	}
	m.n[reason]++
}

// startCounted starts the daemon with the test's configuration and a retryCounter as its Monitor.
func startCounted(t *testing.T, env *pgtest.Env) (*pgtest.Running, *retryCounter) {
	t.Helper()
	mon := &retryCounter{}
	cfg := testConfig(t, env)
	cfg.Monitor = mon
	return startDaemon(t, cfg), mon
}

func (m *retryCounter) counts() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for k, v := range m.n {
		out[k] = v
	}
	return out
}

// A DEFERRABLE primary key is no replica identity, and one statement may pass through duplicate
// keys: a table whose only key it is is never published under that key. With REPLICA IDENTITY
// FULL it is streamed by whole rows (an UPDATE that shifts every key loses nothing), without it
// it is kept by snapshots, named or in the default selection, and the source application's
// UPDATEs keep working. Both were refused.
func TestDeferrableKeyIsNeverPublished(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table d_plain (id int primary key deferrable, v text)`,
		`create table d_full (id int primary key deferrable initially deferred, v text)`,
		`alter table d_full replica identity full`,
		`create table ok (id int primary key, v text)`,
		`insert into d_plain select g, 'p' from generate_series(1, 10) g`,
		`insert into d_full select g, 'f' from generate_series(1, 10) g`,
		`insert into ok select g, 'o' from generate_series(1, 10) g`)
	published := func() []string {
		return pgtest.Rows(t, env.Source, `select tablename::text from pg_publication_tables where pubname = '`+env.Name+`' order by 1`)
	}
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.d_plain,public.d_full,public.ok"}
	d := startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	for _, tab := range []string{"d_plain", "d_full", "ok"} {
		pgtest.WaitConverged(t, env, tab, "id")
	}
	pgtest.Exec(t, env.Source, `update d_plain set v = 'q'`, `update d_full set id = id + 1`, `update ok set v = 'u'`,
		`begin`, `insert into d_full values (3, 'a duplicate until the commit')`, `update d_full set id = 12 where v like 'a duplicate%'`, `commit`)
	pgtest.WaitConverged(t, env, "ok", "id")
	pgtest.WaitConverged(t, env, "d_full", "id")
	if diff := pgtest.Diff([]string{"d_full", "ok"}, published()); diff != "" {
		t.Errorf("published tables: %s", diff)
	}
	if tr := tableReport(t, waitCovered(t, env), "public.d_plain"); tr.Status != coverage.SnapshotOnly || !strings.Contains(tr.Note, "DEFERRABLE") {
		t.Errorf("d_plain: %+v, want snapshot-only because of its DEFERRABLE key", tr)
	}
	d.RequireRunning(t)
}

// Database and role defaults that would cancel, time out or reshape pgconverge's sessions
// (statement_timeout, lock_timeout, idle_session_timeout, serializable or read-only
// transactions, an empty search_path) change nothing: the load and the stream never fail, and a
// lock an operator holds on a target table for a while is waited for.
func TestDatabaseDefaultsDoNotStopTheDaemon(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, repeat('x', 100) from generate_series(1, 20000) g`)
	both := []string{`statement_timeout = '1ms'`, `idle_session_timeout = '1s'`,
		`default_transaction_isolation = 'serializable'`, `search_path = ''`}
	for _, set := range both {
		pgtest.Exec(t, env.Source, fmt.Sprintf(`alter database %s set %s`, env.Name, set))
	}
	for _, set := range append(both, `lock_timeout = '1ms'`, `default_transaction_read_only = on`) {
		pgtest.Exec(t, env.Target, fmt.Sprintf(`alter database %s set %s`, env.Name, set))
	}
	d, mon := startCounted(t, env)
	pgtest.WaitStreaming(t, env)
	pgtest.WaitConverged(t, env, "big", "id")

	// An operator holds the target table for 3 s while the source writes.
	// The operator's own session is spared the database's 1 ms statement_timeout from its start: a
	// SET after connecting runs under it, and a loaded machine can take longer than 1 ms for it.
	u, err := url.Parse(env.TargetURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("statement_timeout", "0")
	u.RawQuery = q.Encode()
	op := pgtest.Connect(t, u.String())
	pgtest.Exec(t, op, `begin`, `lock table public.big in access exclusive mode`)
	pgtest.Exec(t, env.Source, `update big set v = 'locked out' where id <= 100`)
	time.Sleep(3 * time.Second) // the lock is held on purpose for a while, not a synchronisation
	pgtest.Exec(t, op, `commit`)
	pgtest.WaitConverged(t, env, "big", "id")
	d.RequireRunning(t)
	if n := mon.counts(); len(n) != 0 {
		t.Errorf("sessions retried %v, want none", n)
	}
}

// A target constraint that rejects a source row never stops the daemon and never skips the row:
// the session is retried (counted as "constraint") until the operator fixes the target, and then
// the row arrives.
func TestTargetConstraintIsRetriedUntilFixed(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table c (id int primary key, v int)`, `insert into c select g, g from generate_series(1, 10) g`)
	d, mon := startCounted(t, env)
	pgtest.WaitStreaming(t, env)
	pgtest.WaitConverged(t, env, "c", "id")
	pgtest.Exec(t, env.Target, `alter table c add constraint v_small check (v < 100)`)
	pgtest.Exec(t, env.Source, `update c set v = 500 where id = 3`, `insert into c values (11, 11)`)
	pgtest.Eventually(t, 60*time.Second, "two constraint retries", func() (bool, string) {
		n := mon.counts()
		return n["constraint"] >= 2, fmt.Sprint(n)
	})
	d.RequireRunning(t)
	if v := pgtest.Scalar[int](t, env.Target, `select v from c where id = 3`); v != 3 {
		t.Fatalf("target row 3 has v = %d while the constraint refuses 500, want the old 3", v)
	}
	pgtest.Exec(t, env.Target, `alter table c drop constraint v_small`)
	pgtest.WaitConverged(t, env, "c", "id")
	d.RequireRunning(t)
}

// coverage says when no daemon follows a streamed table any more, and since when: the status
// stays covered (its history up to the watermark is), but following turns false, the note says
// "stopped" and the watermark's age grows.
func TestStoppedDaemonIsVisible(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key)`, `insert into a select generate_series(1, 10)`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.WaitSlotCaughtUp(t, env)
	if tr := tableReport(t, waitCovered(t, env), "public.a"); !tr.Following || strings.Contains(tr.Note, "stopped") {
		t.Fatalf("streaming table: %+v, want following and no stopped note", tr)
	}
	d.Stop(t)
	pgtest.Eventually(t, 30*time.Second, "public.a reported stopped for 2 s", func() (bool, string) {
		rep, code := coverageOf(t, env)
		tr := tableReport(t, rep, "public.a")
		ok := code == 0 && tr.Status == "covered" && !tr.Following && strings.HasPrefix(tr.Note, "stopped: ") && tr.WatermarkAgeSeconds >= 2
		return ok, fmt.Sprintf("exit %d: %+v", code, tr)
	})
}

// A non-key column of a domain declared NOT NULL is a plain column of the domain's base type on
// the target (tombstones carry only the key, which such a domain refuses): deletes stream as
// tombstones, values are the source's, and a target table that has the domain (made by an older
// pgconverge) is changed to the base type without a reload.
func TestNotNullDomainColumnTakesTombstones(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	for _, conn := range []*pgx.Conn{env.Source, env.Target} {
		pgtest.Exec(t, conn, `create domain nonempty as text not null check (value <> '')`, `create domain label as nonempty`)
	}
	pgtest.Exec(t, env.Source, `create table t_dom (id int primary key, v nonempty, w label, x nonempty[])`,
		`insert into t_dom select g, 'v' || g, 'w' || g, array['x'] from generate_series(1, 5) g`)
	// The target table as a pgconverge that kept the domain created it (w, over a domain over the
	// NOT NULL one, as this one creates it: a nested domain made plain is reloaded once).
	pgtest.Exec(t, env.Target, `create table t_dom (id int primary key, v nonempty, w text, x nonempty[],
		_cdc_lsn pg_lsn not null, _cdc_seq bigint not null, _cdc_deleted boolean not null default false, _cdc_unknown text[])`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `delete from t_dom where id = 1`, `update t_dom set v = 'changed' where id = 2`,
		`insert into t_dom values (6, 'six', 'six', '{}')`, `delete from t_dom where id = 6`)
	pgtest.WaitConverged(t, env, "t_dom", "id")
	d.RequireRunning(t)
	types := pgtest.Rows(t, env.Target, `select attname || ' ' || format_type(atttypid, atttypmod) from pg_attribute
where attrelid = 't_dom'::regclass and attname in ('v', 'w', 'x') order by attname`)
	if want := []string{"v text", "w text", "x nonempty[]"}; fmt.Sprint(types) != fmt.Sprint(want) {
		t.Errorf("target column types %v, want %v", types, want)
	}
	if n := pgtest.Scalar[int](t, env.Target, `select count(*)::int from pgconverge.tables where table_name = 't_dom' and schema_changed_lsn is not null`); n != 0 {
		t.Errorf("the domain made plain recorded a schema change (a reload); want none")
	}
}

// A change without row events (ADD COLUMN … DEFAULT fills every row, and pgoutput sends nothing)
// is never confirmed to the slot before the target reflects it: confirmed_flush_lsn passes the
// change only once the target table has the column, although keepalives move the stream on.
func TestSlotIsNotConfirmedPastAnUnseenSchemaChange(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	d := streamingTable(t, env)
	pgtest.WaitSlotCaughtUp(t, env)
	addColumnBeforeTheSlot(t, env)
	pgtest.WaitConverged(t, env, "t", "id")
	d.RequireRunning(t)
}

// A primary key dropped while streaming, to be added on other columns a moment later, is waited
// for: the daemon backs off (a "schema" retry) instead of stopping, and follows the new key once
// it exists.
func TestDroppedKeyIsWaitedFor(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key, v text, n int)`,
		`insert into t select g, 'v' || g, g from generate_series(1, 50) g`)
	d, mon := startCounted(t, env)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `alter table t drop constraint t_pkey`, `insert into t values (51, 'keyless', 51)`)
	pgtest.Eventually(t, 60*time.Second, "a schema retry while the table has no key", func() (bool, string) {
		n := mon.counts()
		return n["schema"] > 0, fmt.Sprint(n)
	})
	d.RequireRunning(t)
	pgtest.Exec(t, env.Source, `alter table t add primary key (n)`, `update t set n = n + 1000 where id <= 5`)
	pgtest.WaitConverged(t, env, "t", "n")
	waitTargetKey(t, env, "n")
	d.RequireRunning(t)
}

// A transaction that switches the replica identity to another index, changes rows under it and
// switches back never wedges the stream: its changes under the other identity (old key tuples
// without the table's key) are passed over below the reload's fence, and the reload brings the
// rows; other tables keep streaming.
func TestReplicaIdentitySwitchedAndBackInOneTransaction(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table r (id int primary key, a int not null, c int not null default 0, v text)`,
		`insert into r select g, g, 0, 'x' from generate_series(1, 100) g`, `create unique index r_a on r (a)`,
		`create table other (id int primary key, v text)`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `begin`, `alter table r replica identity using index r_a`,
		`update r set a = -a where id <= 5`, `delete from r where id = 6`, `alter table r replica identity default`,
		`update r set c = 1 where id between 7 and 9`, `commit`,
		`insert into other values (1, 'after')`, `update r set v = 'y' where id = 10`)
	pgtest.WaitConverged(t, env, "r", "id")
	pgtest.WaitConverged(t, env, "other", "id")
	d.RequireRunning(t)
}

// A primary key made DEFERRABLE while streaming is no key: the catalog check notices it and the
// daemon waits (a "schema" retry) instead of stopping, and follows the table again once its key is
// made immediate again.
func TestKeyMadeDeferrableIsWaitedFor(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key, v text)`, `insert into t select g, 'v' from generate_series(1, 20) g`)
	d, mon := startCounted(t, env)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `alter table t drop constraint t_pkey, add primary key (id) deferrable`)
	pgtest.Eventually(t, 60*time.Second, "a schema retry while the key is deferrable", func() (bool, string) {
		n := mon.counts()
		return n["schema"] > 0, fmt.Sprint(n)
	})
	d.RequireRunning(t)
	pgtest.Exec(t, env.Source, `alter table t drop constraint t_pkey, add primary key (id)`, `update t set v = 'w' where id <= 3`, `insert into t values (21, 'x')`)
	pgtest.WaitConverged(t, env, "t", "id")
	d.RequireRunning(t)
}

// A table that cannot be published is named with its real reason, never with a privilege hint:
// in the default selection and named with --tables it is kept by snapshots only, logged with the
// reason, and never published (the default selection left it out).
func TestUnloggedTableIsNamedAndKeptBySnapshots(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create unlogged table scratch (id int primary key, v text)`, `insert into scratch values (1, 'x')`,
		`create table ok (id int primary key, v text)`,
		`insert into ok select g, 'o' from generate_series(1, 10) g`)
	requireReason := func(logs *pgtest.SyncBuffer) {
		t.Helper()
		pgtest.Eventually(t, 30*time.Second, "the log names scratch as UNLOGGED", func() (bool, string) {
			l := logs.String()
			return strings.Contains(l, "public.scratch") && strings.Contains(l, "UNLOGGED: PostgreSQL writes no WAL for it"), ""
		})
		for _, w := range []string{"privilege", "CREATE on the database", "must own"} {
			if strings.Contains(logs.String(), w) {
				t.Errorf("the log gives a privilege hint (%q) for an UNLOGGED table", w)
			}
		}
	}
	published := func() []string {
		return pgtest.Rows(t, env.Source, `select schemaname || '.' || tablename from pg_publication_tables where pubname = '`+env.Name+`'`)
	}
	logs := &pgtest.SyncBuffer{}
	cfg := testConfig(t, env) // the default selection
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(pgtest.LogWriter(t), logs), nil))
	d := startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	requireReason(logs)
	pgtest.WaitConverged(t, env, "scratch", "id")
	pgtest.Exec(t, env.Source, `update ok set v = 'u'`, `insert into scratch values (2, 'y')`)
	pgtest.WaitConverged(t, env, "ok", "id")
	if d := pgtest.Diff([]string{"public.ok"}, published()); d != "" {
		t.Errorf("tables the default selection published: %s", d)
	}
	d.Stop(t)
	logs = &pgtest.SyncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(pgtest.LogWriter(t), logs), nil))
	cfg.Tables = []string{"public.scratch,public.ok"}
	refreshEverySecond(t, &cfg)
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "scratch", "id")
	requireReason(logs)
	if d := pgtest.Diff([]string{"public.ok"}, published()); d != "" {
		t.Errorf("tables published with scratch named: %s", d)
	}
}

// A table streamed by whole rows that loses REPLICA IDENTITY FULL (also one whose only key is
// DEFERRABLE) has no replica identity: the catalog check notices within seconds, with no row
// change (it waited for the table's next change), and the daemon waits for it like a lost key,
// then follows it again once FULL is back.
func TestReplicaIdentityFullTakenAwayIsWaitedFor(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table b (x int, v text)`, `alter table b replica identity full`,
		`create table c (id int primary key deferrable, v text)`, `alter table c replica identity full`,
		`insert into b values (1, 'b')`, `insert into c values (1, 'c')`)
	d, mon := startCounted(t, env)
	pgtest.WaitStreaming(t, env)
	waitSameMultiset(t, env, "b")
	pgtest.Exec(t, env.Source, `alter table b replica identity default`, `alter table c replica identity default`)
	pgtest.Eventually(t, 60*time.Second, "a schema retry while b and c have no replica identity", func() (bool, string) {
		n := mon.counts()
		return n["schema"] > 0, fmt.Sprint(n)
	})
	d.RequireRunning(t)
	pgtest.Exec(t, env.Source, `alter table b replica identity full`, `alter table c replica identity full`,
		`insert into b values (2, 'after')`, `update c set id = id + 1`)
	waitSameMultiset(t, env, "b")
	pgtest.WaitConverged(t, env, "c", "id")
	d.RequireRunning(t)
}
