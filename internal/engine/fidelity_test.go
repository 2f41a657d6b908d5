package engine_test

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// Values travel as text: pgconverge pins the session settings that change how values print and
// parse, so databases whose defaults differ on both sides still get the same values, on the
// backfill path (rows 1..) and the stream path (rows 1001..).
func TestValuesSurviveOddDatabaseSettings(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`alter database `+env.Name+` set timezone = 'America/St_Johns'`, `alter database `+env.Name+` set datestyle = 'German'`,
		`alter database `+env.Name+` set intervalstyle = 'iso_8601'`, `alter database `+env.Name+` set extra_float_digits = -15`,
		`alter database `+env.Name+` set bytea_output = 'escape'`)
	pgtest.Exec(t, env.Target,
		`alter database `+env.Name+` set timezone = 'Pacific/Chatham'`, `alter database `+env.Name+` set datestyle = 'SQL, DMY'`,
		`alter database `+env.Name+` set intervalstyle = 'sql_standard'`, `alter database `+env.Name+` set extra_float_digits = 0`,
		`alter database `+env.Name+` set array_nulls = off`, `alter database `+env.Name+` set xmloption = document`)
	const values = `select 0 + g, 1234.5::money * g, now() - g * interval '1 day 3 hours', interval '-1 year 2 days -03:04:05.678' * g,
  0.1::float8 * g, '-0'::float8, '\x00ff'::bytea, array['a b', 'NULL', null], '<a/>text<b/>'::xml, date '0044-03-15 BC' + g
from generate_series(1, 3) g`
	create := `create table v (id int primary key, m money, ts timestamptz, i interval, f float8, z float8, b bytea, arr text[], x xml, d date)`
	pgtest.Exec(t, env.Source, create, `insert into v `+values)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `insert into v select id + 1000, m, ts, i, f, z, b, arr, x, d from (`+values+`) s(id, m, ts, i, f, z, b, arr, x, d)`,
		`update v set arr = array[null, 'NULL'] where id = 2`)
	pgtest.WaitConverged(t, env, "v", "id")
}

// User-defined enums, domains (also over arrays) and composite types a table uses are created on
// the target as the source defines them, named with their schema whatever the source's
// search_path; a same-named type in another target schema is not used.
func TestUserTypesAreCreatedOnTheTarget(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create schema app`, `create type app.mood as enum ('sad', 'ok', 'happy')`,
		`create domain app.posint as int check (value > 0)`, `create domain app.tags as text[] not null`,
		`create type app.pair as (m app.mood, n app.posint)`,
		`alter database `+env.Name+` set search_path = app, public`)
	src := pgtest.Connect(t, env.SourceURL)
	pgtest.Exec(t, src, `create table public.t (id int primary key, m app.mood, p app.posint, tg app.tags, c app.pair, ca app.pair[])`,
		`insert into public.t values (1, 'ok', 5, '{a,"b c"}', '(happy,7)', array['(sad,1)', null]::app.pair[])`)
	pgtest.Exec(t, env.Target, `create type public.mood as enum ('other')`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, src, `insert into public.t values (2, 'happy', 1, '{}', '(,2)', '{}')`, `update public.t set m = 'sad' where id = 1`)
	pgtest.WaitConverged(t, env, "public.t", "id")
	if got := pgtest.Scalar[string](t, env.Target, `select pg_get_constraintdef(oid) from pg_constraint where contypid = 'app.posint'::regtype`); got != "CHECK ((VALUE > 0))" {
		t.Errorf("domain constraint on the target: %q", got)
	}
	// PostgreSQL 17 and later record a domain's NOT NULL as a named constraint as well.
	if got := pgtest.Scalar[bool](t, env.Target, `select typnotnull from pg_type where oid = 'app.tags'::regtype`); !got {
		t.Errorf("domain app.tags on the target is not NOT NULL")
	}
}

// A publication that publishes partitions through their root never names a partition in its
// changes: selecting a partition of it is refused, naming the fix.
func TestPartitionOfARootPublicationIsRefused(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pub := `"` + env.Name + `"`
	pgtest.Exec(t, env.Source, `create table p (id int primary key, v text) partition by range (id)`,
		`create table p_a partition of p for values from (0) to (1000)`,
		`create publication `+pub+` for table p with (publish_via_partition_root = true)`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.p_a"}
	requireRefusal(t, cfg, "publish_via_partition_root", "p_a")
}

// A user-defined range type is created on the target with its multirange, and an enum label
// added on the source while streaming is added on the target.
func TestUserRangeAndNewEnumLabelsReachTheTarget(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create type floatrange as range (subtype = float8, subtype_diff = float8mi)`,
		`create type mood as enum ('sad', 'happy')`,
		`create table t (id int primary key, r floatrange, mr floatmultirange, m mood)`,
		`insert into t values (1, '[1.5,2.5)', '{[1,2), [3,4]}', 'sad')`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `alter type mood add value 'ok' before 'happy'`, `insert into t values (2, 'empty', '{}', 'ok')`)
	pgtest.WaitConverged(t, env, "t", "id")
	got := pgtest.Rows(t, env.Target, `select e.enumlabel from pg_enum e where e.enumtypid = 'mood'::regtype order by e.enumsortorder`)
	if d := pgtest.Diff([]string{"sad", "ok", "happy"}, got); d != "" {
		t.Errorf("target enum labels:\n%s", d)
	}
}

// A range type that needs a function the target lacks stops the daemon, naming the fix.
func TestRangeTypeNeedingAMissingFunctionIsRefused(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create function my_diff(a float8, b float8) returns float8 language sql immutable as 'select a - b'`,
		`create type floatrange as range (subtype = float8, subtype_diff = my_diff)`,
		`create table t (id int primary key, r floatrange)`)
	requireRefusal(t, testConfig(t, env), "create type public.floatrange", "create what it needs on the target first")
}

// A value the target refuses (here a target domain with a stricter check) never stops the daemon
// and is never skipped: each try logs at ERROR the table, the column and the value, and on the
// stream path the row's key, and counts a "constraint" retry, until the source or the target is
// fixed; then the value arrives.
func TestRefusedValueNamesTheRowAndColumn(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create domain score as int check (value >= 0)`,
		`create table t (id int primary key, s score)`, `insert into t values (1, 5), (2, 50), (3, 7)`)
	pgtest.Exec(t, env.Target, `create domain score as int check (value < 10)`)
	logs := &pgtest.SyncBuffer{}
	mon := &retryCounter{}
	cfg := testConfig(t, env)
	cfg.Logger, cfg.Monitor = slog.New(slog.NewTextHandler(io.MultiWriter(pgtest.LogWriter(t), logs), nil)), mon
	d := startDaemon(t, cfg)
	waitLogged := func(want ...string) {
		t.Helper()
		pgtest.Eventually(t, time.Minute, fmt.Sprintf("an ERROR naming %q", want), func() (bool, string) {
			for _, w := range want {
				if !strings.Contains(logs.String(), w) {
					return false, "not logged yet: " + w
				}
			}
			return mon.counts()["constraint"] > 0, fmt.Sprint(mon.counts())
		})
		d.RequireRunning(t)
	}
	waitLogged("level=ERROR", "public.t", `line 2, column s: \"50\"`)

	pgtest.Exec(t, env.Source, `update t set s = 1 where id = 2`)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `insert into t values (4, 1), (5, 60)`)
	waitLogged("key (id) = (5)", `column \"s\" (type public.score) with value \"60\"`)
	pgtest.Exec(t, env.Target, `alter domain score drop constraint score_check`)
	pgtest.WaitConverged(t, env, "t", "id")
	d.RequireRunning(t)
}
