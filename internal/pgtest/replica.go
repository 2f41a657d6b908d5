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
	Eventually(t, 60*time.Second, "target "+table+" equals source", func() (bool, string) {
		want := Rows(t, env.Source, src)
		var got []string
		rows, err := env.Target.Query(context.Background(), tgt)
		if err == nil {
			got, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			return false, err.Error()
		}
		d := Diff(want, got)
		return d == "", d
	})
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
