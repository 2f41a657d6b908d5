package engine_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// waitSpansConfirmed polls until spans open stream spans are confirmed past source position
// after: two membership checks that started after it found every table as it was
// (catalogWatcher.checkMemberships confirms the position read before the previous check).
func waitSpansConfirmed(t *testing.T, env *pgtest.Env, after pglogrepl.LSN, spans int64) {
	t.Helper()
	pgtest.Eventually(t, 60*time.Second, "memberships confirmed past "+after.String(), func() (bool, string) {
		// The stream records a confirmed position with an apply, and an idle one applies only
		// when the source's WAL moves: a logical message no publication carries moves it.
		pgtest.Exec(t, env.Source, `select pg_logical_emit_message(false, 'pgconverge-test', 'tick')`)
		n := pgtest.Scalar[int64](t, env.Target,
			`select count(*) from pgconverge.table_spans where end_lsn is null and confirmed_lsn >= $1::pg_lsn`, after.String())
		return n == spans, fmt.Sprintf("%d of %d open spans confirmed past %s", n, spans, after)
	})
}

// Catalog changes that change neither rows nor publication membership (privileges, comments,
// statistics, storage options), of a table published through its schema and of partitions of a
// partitioned one, load nothing again: two membership checks after them find every table as it
// was, the changes made meanwhile are streamed, and no backfill ran.
func TestCatalogChangesThatKeepRowsLoadNothing(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 15, "row filters, column lists and schema publications")
	partitioned(t, env)
	pub := `"` + env.Name + `"`
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`,
		`insert into a select g, 'v' from generate_series(1, 100) g`,
		`create publication `+pub+` for tables in schema public with (publish_via_partition_root = true)`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitConverged(t, env, "p", "id, region")
	pgtest.WaitStreaming(t, env)
	runs := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_runs`)

	pgtest.Exec(t, env.Source, `grant insert on p_eu to public`,
		`grant select on all tables in schema public to public`, `revoke select on a from public`,
		`comment on table a is 'app table'`, `comment on table p_us_low is 'low ids'`,
		`alter table a set (fillfactor = 80)`, `alter table p_us_high set (autovacuum_enabled = false)`,
		`alter table a alter column v set statistics 500`, `analyze a`, `analyze p`,
		`update a set v = 'after' where id <= 10`, `insert into p values (5000, 'us', 'after')`)
	after := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	waitSpansConfirmed(t, env, after, 2)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitConverged(t, env, "p", "id, region")
	waitCovered(t, env)
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfill_runs`); n != runs {
		t.Errorf("%d backfill runs after the catalog changes, want the %d of the start", n, runs)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.table_spans`); n != 2 {
		t.Errorf("%d table spans, want 2 (one per table, never ended)", n)
	}
	d.RequireRunning(t)
}
