package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// SourceColumns returns the table's replicated columns, quoted, in order.
func SourceColumns(t *testing.T, conn *pgx.Conn, table string) string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `select quote_ident(attname) from pg_attribute
where attrelid = $1::regclass and attnum > 0 and not attisdropped and attgenerated = '' order by attnum`, table)
	if err == nil {
		var cols []string
		if cols, err = pgx.CollectRows(rows, pgx.RowTo[string]); err == nil {
			return strings.Join(cols, ", ")
		}
	}
	t.Fatalf("columns of %s: %v", table, err)
	return ""
}

// WaitConverged polls until the target's live rows of table equal the source's rows, compared as
// row(...)::text of the source's columns ordered by orderBy.
func WaitConverged(t *testing.T, env *Env, table, orderBy string) {
	t.Helper()
	WaitConvergedColumns(t, env, table, SourceColumns(t, env.Source, table), orderBy)
}

// WaitConvergedColumns is WaitConverged comparing the columns cols (SQL, comma-separated).
func WaitConvergedColumns(t *testing.T, env *Env, table, cols, orderBy string) {
	t.Helper()
	src := fmt.Sprintf("select row(%s)::text from %s order by %s", cols, table, orderBy)
	tgt := fmt.Sprintf("select row(%s)::text from %s where not _cdc_deleted order by %s", cols, table, orderBy)
	WaitSameRows(t, env, "target "+table+" equals source", src, tgt, Diff)
}

// WaitSameRows polls for 60 s until diff of the rows of src on the source and of tgt on the
// target (each a query of one text column, as Rows) is "", and fails the test otherwise with
// what and the last difference. An error of src fails the test at once; one of tgt is a
// difference.
//
// A poll first compares a summary each server computes of the query's rows (their count and the
// sum of their md5 hashes, the same for the same rows in any order), and fetches the rows only
// when the summaries are equal: they decide, with diff. A test waiting for a large table thus does
// not fetch it twice every 50 ms, which on this 2-core machine took the CPU of the tests running
// beside it. The pause between polls is at least 50 ms and twice what the last poll took.
func WaitSameRows(t *testing.T, env *Env, what, src, tgt string, diff func(want, got []string) string) {
	t.Helper()
	const timeout = 60 * time.Second
	summary := func(query string) string {
		return "select count(*)::text || ' ' || coalesce(sum(('x' || substr(md5(r), 1, 16))::bit(64)::bigint::numeric), 0)::text from (" + query + ") q(r)"
	}
	srcSum, tgtSum := summary(src), summary(tgt)
	compare := func() string {
		want := Rows(t, env.Source, src)
		rows, err := env.Target.Query(context.Background(), tgt)
		if err != nil {
			return err.Error()
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err.Error()
		}
		return diff(want, got)
	}
	deadline := time.Now().Add(timeout)
	for {
		began := time.Now()
		want := Scalar[string](t, env.Source, srcSum)
		var got string
		if err := env.Target.QueryRow(context.Background(), tgtSum).Scan(&got); err == nil && got == want && compare() == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s; last seen: %s", what, timeout, compare())
		}
		time.Sleep(max(50*time.Millisecond, 2*time.Since(began)))
	}
}

// WaitSlotCaughtUp polls until the slot's confirmed_flush_lsn reaches the source's WAL insert
// position as read now (which, unlike pg_current_wal_lsn, covers commits not yet written under
// synchronous_commit = off), and returns that position.
func WaitSlotCaughtUp(t *testing.T, env *Env) string {
	t.Helper()
	var lsn string
	if err := env.Source.QueryRow(context.Background(), "select pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 60*time.Second, "confirmed_flush_lsn reaches "+lsn, func() (bool, string) {
		var ok bool
		var seen *string
		err := env.Source.QueryRow(context.Background(), `select confirmed_flush_lsn >= $2::pg_lsn, confirmed_flush_lsn::text
from pg_replication_slots where slot_name = $1`, env.Name, lsn).Scan(&ok, &seen)
		if err != nil {
			return false, err.Error()
		}
		return ok, fmt.Sprint(*seen)
	})
	return lsn
}

// Scalar runs a one-value query.
func Scalar[T any](t *testing.T, conn *pgx.Conn, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// WaitStreaming polls until the daemon's walsender streams from the slot (pg_stat_replication
// state catchup or streaming, not merely holding the slot it created): the initial load is over
// and changes from now on arrive through the stream.
func WaitStreaming(t *testing.T, env *Env) {
	t.Helper()
	Eventually(t, 60*time.Second, "slot "+env.Name+" streaming", func() (bool, string) {
		var state string
		err := env.Source.QueryRow(context.Background(), `select coalesce(r.state, 'no walsender') from pg_replication_slots s
left join pg_stat_replication r on r.pid = s.active_pid where s.slot_name = $1`, env.Name).Scan(&state)
		if err != nil {
			return false, err.Error()
		}
		return state == "streaming" || state == "catchup", "walsender state " + state
	})
}

// RequireSourceVersion skips the test when env's source is older than PostgreSQL major, naming
// what the test needs that came with major (such as "row filters", 15).
func RequireSourceVersion(t *testing.T, env *Env, major int, what string) {
	t.Helper()
	if v := Scalar[int](t, env.Source, `select current_setting('server_version_num')::int / 10000`); v < major {
		t.Skipf("%s came with PostgreSQL %d; the source runs %d", what, major, v)
	}
}
