package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// sequenceRow is one line of `pgconverge sequences` output.
type sequenceRow struct{ tables, source, before, after, action string }

// runSequences runs `pgconverge sequences` with args against env and returns its output lines by
// sequence name, and its error.
func runSequences(t *testing.T, env *pgtest.Env, args ...string) (map[string]sequenceRow, string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), append([]string{"sequences", "--source", env.SourceURL, "--target", env.TargetURL, "--log-format", "text"}, args...), &out, pgtest.LogWriter(t))
	t.Logf("pgconverge sequences %s:\n%s", strings.Join(args, " "), out.String())
	return parseSequences(t, out.String()), out.String(), err
}

// parseSequences reads printSequences' table: columns are separated by two or more spaces.
func parseSequences(t *testing.T, out string) map[string]sequenceRow {
	t.Helper()
	rows := map[string]sequenceRow{}
	sep := regexp.MustCompile(`\s{2,}`)
	for _, line := range strings.Split(out, "\n") {
		f := sep.Split(strings.TrimSpace(line), -1)
		if len(f) != 6 || f[0] == "TABLE" {
			continue
		}
		rows[f[1]] = sequenceRow{tables: f[0], source: f[2], before: f[3], after: f[4], action: f[5]}
	}
	return rows
}

// sequenceParamsSQL reads a sequence's parameters as pg_sequences shows them.
const sequenceParamsSQL = `select row(data_type, start_value, min_value, max_value, increment_by, cycle, cache_size)::text
from pg_sequences where schemaname = $1 and sequencename = $2`

// Every way a table uses a sequence, in both directions, with the target missing, behind and
// ahead: the output names each action precisely, missing sequences are created with the source's
// parameters, and the target's next value is past every value the source handed out.
func TestSequenceSync(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table ser (id serial primary key, v text)`,
		`insert into ser (v) values ('a'), ('b'), ('c')`,
		`create table ident (id bigint generated always as identity (start with 100 increment by 10) primary key, v text)`,
		`insert into ident (v) values ('a'), ('b')`,
		`create sequence shared_seq start 1000`,
		`create table sa (id bigint primary key default nextval('shared_seq'), v text)`,
		`create table sb (id bigint primary key default nextval('shared_seq'), v text)`,
		`insert into sa (v) values ('a'), ('b')`, `insert into sb (v) values ('c')`,
		`create sequence down_seq increment by -1 minvalue -1000 maxvalue -1 start -1`,
		`create sequence down2_seq increment by -1 minvalue -1000 maxvalue -1 start -1`,
		`create table dn (id int primary key default nextval('down_seq'), id2 int default nextval('down2_seq'))`,
		`insert into dn default values`, `insert into dn default values`, `insert into dn default values`,
		`create schema "Sales"`,
		`create table "Sales"."Order Items" (id serial primary key, v text)`,
		`insert into "Sales"."Order Items" (v) values ('a'), ('b')`,
		`create sequence cached_seq cache 20`,
		`create table cached (id bigint primary key default nextval('cached_seq'))`,
		`insert into cached default values`,
		`create table fresh (id serial primary key)`,
	)
	// A second session takes its own block of 20: the first session's cached 2..20 are never used,
	// and the source's last_value is 40.
	other := pgtest.Connect(t, env.SourceURL)
	pgtest.Exec(t, other, `insert into cached default values`)
	// The target already has some: ser's ahead, ident's behind, down2's ahead (lower).
	pgtest.Exec(t, env.Target,
		`create sequence ser_id_seq`, `select setval('ser_id_seq', 500)`,
		`create sequence ident_id_seq as bigint start 100 increment 10 minvalue 1`, `select setval('ident_id_seq', 100)`,
		`create sequence down2_seq increment by -1 minvalue -1000 maxvalue -1 start -1`, `select setval('down2_seq', -50)`,
	)

	rows, out, err := runSequences(t, env, "--table", "public.ser,public.ident", "--table", "public.sa", "--table", "public.sb,public.dn",
		"--table", `"Sales"."Order Items"`, "--table", "public.cached", "--table", "public.fresh")
	if err != nil {
		t.Fatalf("sequences: %v", err)
	}
	want := map[string]sequenceRow{
		"public.ser_id_seq":            {"public.ser", "3", "500", "500", "kept (target ahead)"},
		"public.ident_id_seq":          {"public.ident", "110", "100", "110", "advanced"},
		"public.shared_seq":            {"public.sa,public.sb", "1002", "-", "1002", "created"},
		"public.down_seq":              {"public.dn", "-3", "-", "-3", "created"},
		"public.down2_seq":             {"public.dn", "-3", "-50", "-50", "kept (target ahead)"},
		`"Sales"."Order Items_id_seq"`: {`"Sales"."Order Items"`, "2", "-", "2", "created"},
		"public.cached_seq":            {"public.cached", "40", "-", "40", "created"},
		"public.fresh_id_seq":          {"public.fresh", "1 (not called)", "-", "1 (not called)", "created"},
	}
	for seq, w := range want {
		if got, ok := rows[seq]; !ok {
			t.Errorf("no line for %s", seq)
		} else if got != w {
			t.Errorf("%s: got %+v, want %+v", seq, got, w)
		}
	}
	if len(rows) != len(want) {
		t.Errorf("%d lines, want %d", len(rows), len(want))
	}
	if !strings.Contains(out, "8 sequences: 5 created, 1 advanced, 2 kept (target ahead)") {
		t.Errorf("summary line missing or wrong")
	}

	// Missing sequences were created with the source's parameters.
	for _, n := range [][2]string{{"public", "shared_seq"}, {"public", "down_seq"}, {"Sales", "Order Items_id_seq"}, {"public", "cached_seq"}, {"public", "fresh_id_seq"}} {
		src := pgtest.Scalar[string](t, env.Source, sequenceParamsSQL, n[0], n[1])
		if tgt := pgtest.Scalar[string](t, env.Target, sequenceParamsSQL, n[0], n[1]); tgt != src {
			t.Errorf("%s.%s parameters on the target %s, on the source %s", n[0], n[1], tgt, src)
		}
	}

	// The target's next values are past every id the source handed out.
	for _, c := range []struct {
		seq, ids string
		next     int64
		desc     bool
	}{
		{"ser_id_seq", "select max(id) from ser", 501, false},
		{"ident_id_seq", "select max(id) from ident", 120, false},
		{"shared_seq", "select greatest((select max(id) from sa), (select max(id) from sb))", 1003, false},
		{"down_seq", "select min(id) from dn", -4, true},
		{"down2_seq", "select min(id2) from dn", -51, true},
		{`"Sales"."Order Items_id_seq"`, `select max(id) from "Sales"."Order Items"`, 3, false},
		{"cached_seq", "select max(id) from cached", 41, false},
		{"fresh_id_seq", "select coalesce(max(id), 0) from fresh", 1, false},
	} {
		got := pgtest.Scalar[int64](t, env.Target, fmt.Sprintf("select nextval('%s')", strings.ReplaceAll(c.seq, "'", "''")))
		handed := pgtest.Scalar[int64](t, env.Source, c.ids)
		if got != c.next {
			t.Errorf("nextval(%s) on the target = %d, want %d", c.seq, got, c.next)
		}
		if (!c.desc && got <= handed) || (c.desc && got >= handed) {
			t.Errorf("nextval(%s) on the target = %d, not past the source's %d", c.seq, got, handed)
		}
	}
	if got := pgtest.Scalar[int64](t, env.Source, "select max(id) from cached"); got != 21 {
		t.Errorf("source ids of cached: max %d, want 21 (the second session's block)", got)
	}

	// Again: every target sequence is now at or past the source's.
	rows, _, err = runSequences(t, env, "--table", "public.ser,public.ident,public.dn")
	if err != nil {
		t.Fatalf("sequences again: %v", err)
	}
	for seq, action := range map[string]string{"public.ser_id_seq": "kept (target ahead)", "public.ident_id_seq": "kept (target ahead)",
		"public.down_seq": "kept (target ahead)", "public.down2_seq": "kept (target ahead)"} {
		if rows[seq].action != action {
			t.Errorf("second run, %s: action %q, want %q", seq, rows[seq].action, action)
		}
	}
}

// A role that may not read a sequence gets an error naming the sequence and the GRANT, and exit
// status 1; the sequences it could read are still synced.
func TestSequencePrivilege(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	role := env.Name + "_r"
	pgtest.Exec(t, env.Source, `create table a (id serial primary key)`, `create table b (id serial primary key)`,
		`insert into a default values`, `insert into b default values`,
		fmt.Sprintf(`create role %s login`, role), fmt.Sprintf(`grant select on sequence a_id_seq to %s`, role))
	t.Cleanup(func() {
		pgtest.Exec(t, env.Source, fmt.Sprintf(`drop owned by %s`, role), fmt.Sprintf(`drop role %s`, role))
	})
	env.SourceURL = strings.Replace(env.SourceURL, "postgres@", role+"@", 1)
	rows, _, err := runSequences(t, env, "--table", "public.a,public.b")
	if err == nil {
		t.Fatal("sequences succeeded without SELECT on b_id_seq")
	}
	for _, w := range []string{"public.b_id_seq", "GRANT SELECT ON SEQUENCE \"public\".\"b_id_seq\" TO <role>"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	if rows["public.a_id_seq"].action != "created" || rows["public.b_id_seq"].action != "error (below)" {
		t.Errorf("lines %+v: want a_id_seq created and b_id_seq an error", rows)
	}
}
