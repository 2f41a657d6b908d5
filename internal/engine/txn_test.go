package engine_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// commitState is what a target session saw in one statement (one snapshot) right after a stream
// apply committed: the progress LSN and the live rows of the atomic transaction in a and b.
type commitState struct {
	progress string
	a, b     int64
	err      error
}

// TestTransactions: what the source rolled back never reaches the target, prepared transactions
// land only when committed, and a transaction over two tables lands in one target commit.
func TestTransactions(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	t.Cleanup(func() { rollbackPrepared(t, env) })
	pgtest.Exec(t, env.Source, `create table a (id int primary key, tag text)`, `create table b (id int primary key, tag text)`,
		`insert into a values (100, 'loaded')`)
	cfg := testConfig(t, env)
	// After every stream apply, before the next one, a separate target session records what is
	// visible: together these are every state of a and b the stream committed.
	observer := pgtest.Connect(t, env.TargetURL)
	var mu sync.Mutex
	var seen []commitState
	cfg.Knobs.Stream.AfterApply = func(pglogrepl.LSN) {
		var s commitState
		s.err = observer.QueryRow(context.Background(), `select coalesce((select applied_lsn::text from pgconverge.progress where slot = $1), ''),
  (select count(*) from a where tag = 'atomic' and not _cdc_deleted), (select count(*) from b where tag = 'atomic' and not _cdc_deleted)`,
			env.Name).Scan(&s.progress, &s.a, &s.b)
		mu.Lock()
		seen = append(seen, s)
		mu.Unlock()
	}
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)

	t.Run("rollback", func(t *testing.T) {
		pgtest.Exec(t, env.Source, `begin; insert into a values (1, 'rolled back'); update a set tag = 'rolled back' where id = 100;
delete from a where id = 100; rollback`,
			`insert into a values (2, 'after the rollback')`)
		pgtest.WaitConverged(t, env, "a", "id")
		requireNoTrace(t, env, "a", 1)
	})

	t.Run("savepoint", func(t *testing.T) {
		pgtest.Exec(t, env.Source, `begin; insert into a values (10, 'kept'); savepoint s;
insert into a values (11, 'undone'); update a set tag = 'undone' where id in (10, 100); delete from a where id = 2;
rollback to savepoint s; insert into a values (12, 'after the savepoint'); commit`)
		pgtest.WaitConverged(t, env, "a", "id")
		requireNoTrace(t, env, "a", 11)
		if got := pgtest.Scalar[string](t, env.Target, `select string_agg(id || ' ' || tag, ', ' order by id) from a where id in (2, 10, 12, 100)`); got != "2 after the rollback, 10 kept, 12 after the savepoint, 100 loaded" {
			t.Errorf("target rows: %s", got)
		}
	})

	t.Run("two-phase", func(t *testing.T) {
		pgtest.Exec(t, env.Source, `begin; insert into a values (20, 'prepared, committed'); prepare transaction 'fid_commit'`,
			`begin; insert into a values (21, 'prepared, rolled back'); update a set tag = 'x' where id = 100; prepare transaction 'fid_rollback'`,
			`insert into b values (1, 'after prepare')`)
		pgtest.WaitConverged(t, env, "b", "id") // the stream passed both PREPAREs
		requireNoTrace(t, env, "a", 20)
		requireNoTrace(t, env, "a", 21)
		pgtest.Exec(t, env.Source, `commit prepared 'fid_commit'`, `rollback prepared 'fid_rollback'`, `insert into b values (2, 'after commit prepared')`)
		pgtest.WaitConverged(t, env, "b", "id")
		pgtest.WaitConverged(t, env, "a", "id")
		requireNoTrace(t, env, "a", 21)
	})

	// 12,000 changes: more than one stream apply groups (10,000), so a split would show.
	t.Run("two tables atomically", func(t *testing.T) {
		pgtest.Exec(t, env.Source, `begin; insert into a select g, 'atomic' from generate_series(1000, 6999) g;
insert into b select g, 'atomic' from generate_series(1000, 6999) g; commit`)
		pgtest.WaitConverged(t, env, "a", "id")
		pgtest.WaitConverged(t, env, "b", "id")
		versions := pgtest.Rows(t, env.Target, `select format('%s %s %s %s', t, count(distinct lsn), min(seq), max(seq)) from (
  select 'a' t, _cdc_lsn lsn, _cdc_seq seq from a where tag = 'atomic' union all select 'b', _cdc_lsn, _cdc_seq from b where tag = 'atomic') v
group by t order by t`)
		if fmt.Sprint(versions) != "[a 1 1 6000 b 1 6001 12000]" {
			t.Errorf("versions per table (distinct LSNs, first and last ordinal): %v, want one LSN, ordinals 1..6000 in a and 6001..12000 in b", versions)
		}
		commitLSN := pgtest.Scalar[string](t, env.Target, `select max(_cdc_lsn)::text from a where tag = 'atomic'`)
		if n := pgtest.Scalar[int64](t, env.Target, `select count(distinct _cdc_lsn) from (select _cdc_lsn from a where tag = 'atomic' union all select _cdc_lsn from b where tag = 'atomic') v`); n != 1 {
			t.Errorf("the transaction's rows carry %d commit LSNs, want 1", n)
		}
		mu.Lock()
		defer mu.Unlock()
		landed := false
		for _, s := range seen {
			if s.err != nil {
				t.Fatalf("observe target after an apply: %v", s.err)
			}
			atCommit := s.progress != "" && lsnMust(t, s.progress) >= lsnMust(t, commitLSN)
			switch {
			case s.a == 6000 && s.b == 6000 && atCommit:
				landed = true
			case s.a == 0 && s.b == 0 && !atCommit:
			default:
				t.Errorf("after an apply the target showed %d rows in a, %d in b, progress %s (commit %s): not one whole transaction",
					s.a, s.b, s.progress, commitLSN)
			}
		}
		if !landed {
			t.Errorf("no apply showed the transaction landed (%d applies observed)", len(seen))
		}
	})
}

// requireNoTrace requires that the target holds no row for key id in table, live or tombstone.
func requireNoTrace(t *testing.T, env *pgtest.Env, table string, id int) {
	t.Helper()
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from `+pgx.Identifier{table}.Sanitize()+` where id = $1`, id); n != 0 {
		t.Errorf("target %s has %d rows (live or tombstone) for id %d, want none", table, n, id)
	}
}

// rollbackPrepared rolls back the transactions a failed test left prepared in its source database,
// which would otherwise keep the database from being dropped.
func rollbackPrepared(t *testing.T, env *pgtest.Env) {
	for _, gid := range pgtest.Rows(t, env.Source, `select gid from pg_prepared_xacts where database = current_database()`) {
		pgtest.Exec(t, env.Source, `rollback prepared `+quoteLiteral(gid))
	}
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
