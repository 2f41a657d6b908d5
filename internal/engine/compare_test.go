package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// How the fidelity tests compare, and why.
//
// A value's text is a function of the value and of the session that prints it: the same
// timestamptz prints differently under two TimeZones, a float8 loses digits under a negative
// extra_float_digits, an interval reads differently under IntervalStyle sql_standard. So comparing
// the source's row::text printed in one session with the target's printed in a session with other
// settings proves nothing: correct data would differ (timestamptz), and where both print alike
// the check is no stronger than one made under equal settings.
//
// What can go wrong is pgconverge's own sessions: values travel between the sides as text, so if
// the daemon printed a value under the source database's defaults and parsed it under the
// target database's, the target would store another value (a timestamp shifted by hours, a float
// cut to a few digits). The tests therefore make the two databases' defaults (ALTER DATABASE ...
// SET, which every new session of pgconverge inherits unless it pins the setting) differ from
// each other and from pgconverge's pinned settings (oddDatabaseDefaults), and then compare what
// each side stores, rendered by two sessions pinned to the same settings (renderSettings: lossless,
// and different again from both databases and from pgconverge). Equal stored values render
// equally; a value changed in transit renders differently.
//
// Text under lossless settings is readable in a failure message, but it is still text. The
// second check, where every column type is built in (user-defined types have other oids on the
// target, and record_send writes them), is each row's binary send form (record_send): the
// exact stored representation, independent of any session setting — float bits (-0, NaN,
// subnormals), numeric's display scale, array bounds, microseconds of timestamps.

// renderSettings are the session settings under which both sides print rows for comparison.
// Every one is lossless (extra_float_digits > 0 prints floats exactly; ISO dates and iso_8601
// intervals keep every field) and none is pgconverge's own (pgsession) or a database default
// set by oddDatabaseDefaults.
var renderSettings = map[string]string{
	"TimeZone":           "Asia/Kathmandu",
	"DateStyle":          "ISO, DMY",
	"IntervalStyle":      "iso_8601",
	"extra_float_digits": "1",
	"bytea_output":       "hex",
	"xmloption":          "content",
	"client_encoding":    "UTF8",
	"array_nulls":        "on",
	"lc_monetary":        "C",
	"search_path":        "public",
	// how this test's own string literals parse
	"standard_conforming_strings": "on",
}

// oddDatabaseDefaults sets database defaults on both sides that differ from each other, from
// pgconverge's pinned settings and from renderSettings; any setting pgconverge forgot to pin
// would change values in transit.
func oddDatabaseDefaults(t *testing.T, env *pgtest.Env) {
	t.Helper()
	set := func(conn *pgx.Conn, settings ...string) {
		for _, s := range settings {
			pgtest.Exec(t, conn, `alter database `+pgx.Identifier{env.Name}.Sanitize()+` set `+s)
		}
	}
	set(env.Source, `timezone = 'America/St_Johns'`, `datestyle = 'German'`, `intervalstyle = 'sql_standard'`,
		`extra_float_digits = -15`, `bytea_output = 'escape'`, `xmloption = document`, `search_path = nowhere`,
		`standard_conforming_strings = off`)
	set(env.Target, `timezone = 'Pacific/Chatham'`, `datestyle = 'Postgres, MDY'`, `intervalstyle = 'postgres_verbose'`,
		`extra_float_digits = 0`, `bytea_output = 'escape'`, `xmloption = document`, `array_nulls = off`,
		`search_path = elsewhere`, `standard_conforming_strings = off`)
}

// connectRendering opens a connection to url pinned to renderSettings.
func connectRendering(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range renderSettings {
		cfg.RuntimeParams[k] = v
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// renderedRows returns table's rows (live rows on the target) ordered by orderBy, each as the md5
// of its text, the md5 of its binary send form (when binary) and the start of its text.
func renderedRows(conn *pgx.Conn, table, cols, orderBy string, binary, target bool) ([]string, error) {
	send := `''`
	if binary {
		send = `md5(record_send(r))`
	}
	where := ""
	if target {
		where = " where not _cdc_deleted"
	}
	q := fmt.Sprintf(`select md5(r::text) || ' ' || %s || ' ' || left(r::text, 160)
from (select row(%s) r, %s from %s%s) s order by %s`, send, cols, orderBy, table, where, orderBy)
	rows, err := conn.Query(context.Background(), q)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// requireSameRows polls until the target's live rows of table render exactly as the source's
// rows, both rendered by sessions pinned to renderSettings (src and tgt from connectRendering).
// binary adds the check of each row's binary send form; leave it out when a column's type is
// user-defined (its oid differs on the target) or has no binary form (aclitem).
func requireSameRows(t *testing.T, src, tgt *pgx.Conn, table, orderBy string, binary bool) {
	t.Helper()
	cols := pgtest.SourceColumns(t, src, table)
	pgtest.Eventually(t, 60*time.Second, "target "+table+" equals source", func() (bool, string) {
		want, err := renderedRows(src, table, cols, orderBy, binary, false)
		if err != nil {
			t.Fatalf("source %s: %v", table, err)
		}
		got, err := renderedRows(tgt, table, cols, orderBy, binary, true)
		if err != nil {
			return false, err.Error()
		}
		d := pgtest.Diff(want, got)
		return d == "", strings.ToValidUTF8(d, "?")
	})
}
