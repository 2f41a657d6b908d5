package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/internal/verify"
)

// verifyCmd runs `pgconverge verify --format json` with extra flags and returns the report, the
// exit status the process would have and its error.
func verifyCmd(t *testing.T, env *pgtest.Env, extra ...string) (verify.Report, int, error) {
	t.Helper()
	var out bytes.Buffer
	args := append([]string{"verify", "--source", env.SourceURL, "--target", env.TargetURL, "--format", "json", "--log-format", "text"}, extra...)
	err := run(context.Background(), args, &out, pgtest.LogWriter(t))
	code := exitCode(err)
	var rep verify.Report
	if out.Len() > 0 {
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("verify JSON: %v\n%s", err, out.String())
		}
	}
	return rep, code, err
}

// verify exits 0 when nothing is open, 4 with open discrepancies (in its JSON too), 0 again after
// --repair; --no-values records no values; a table it cannot compare is an error naming it.
func TestVerifyCommand(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key, secret text)`,
		`insert into t select g, 'secret ' || g from generate_series(1, 1000) g`)
	startRun(t, env)
	pgtest.WaitConverged(t, env, "t", "id")
	if rep, code, err := verifyCmd(t, env); code != 0 || rep.Open != 0 || len(rep.Tables) != 1 || rep.Tables[0].RowsCompared != 1000 {
		t.Fatalf("equal: exit %d (%v), %+v", code, err, rep)
	}
	pgtest.Exec(t, env.Target, `update t set secret = 'leaked' where id = 5`)
	rep, code, _ := verifyCmd(t, env, "--no-values", "--table", "public.t")
	if code != exitOpen || rep.Open != 1 || rep.Tables[0].Found["different"] != 1 {
		t.Fatalf("drift: exit %d, %+v", code, rep)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.discrepancies where source_values is not null or target_values is not null`); n != 0 {
		t.Errorf("--no-values recorded the values of %d discrepancies", n)
	}
	if rep, code, err := verifyCmd(t, env, "--repair"); code != 0 || rep.Repaired != 1 || rep.Open != 0 {
		t.Fatalf("repair: exit %d (%v), %+v", code, err, rep)
	}
	pgtest.WaitConverged(t, env, "t", "id")
	_, code, err := verifyCmd(t, env, "--table", "public.nosuch")
	if code != 1 || err == nil || !strings.Contains(err.Error(), "public.nosuch") {
		t.Errorf("unknown table: exit %d, %v", code, err)
	}
}

// verify --schema exits 0 on equal schemas and 4 on a difference, printing each with its fix
// (text) or as JSON; flags of a row comparison are refused with it.
func TestVerifySchemaCommand(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	for _, conn := range []*pgx.Conn{env.Source, env.Target} {
		pgtest.Exec(t, conn, `create table t (id int primary key, v text not null)`, `create index t_v_idx on t (v)`)
	}
	base := []string{"verify", "--schema", "--source", env.SourceURL, "--target", env.TargetURL, "--table", "public.t", "--log-format", "text"}
	cmd := func(extra ...string) (string, int, error) {
		var out bytes.Buffer
		err := run(context.Background(), append(base, extra...), &out, pgtest.LogWriter(t))
		return out.String(), exitCode(err), err
	}
	if out, code, err := cmd(); code != 0 || !strings.Contains(out, "differences 0, pending finalize 0") {
		t.Fatalf("equal schemas: exit %d (%v)\n%s", code, err, out)
	}
	pgtest.Exec(t, env.Target, `drop index t_v_idx`)
	out, code, _ := cmd()
	if code != exitOpen || !strings.Contains(out, "public.t: index t_v_idx missing on the target") ||
		!strings.Contains(out, "fix: CREATE INDEX t_v_idx ON public.t USING btree (v);") {
		t.Errorf("a missing index: exit %d\n%s", code, out)
	}
	out, code, _ = cmd("--format", "json")
	var rep verify.SchemaReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != exitOpen || rep.Differences != 1 || rep.Tables[0].Differences[0].Kind != "index" {
		t.Errorf("a missing index, JSON: exit %d, %v\n%s", code, err, out)
	}
	for _, bad := range [][]string{{"--repair"}, {"--incremental"}} {
		if _, code, err := cmd(bad...); code != 1 || err == nil || !strings.Contains(err.Error(), "--schema compares schemas") {
			t.Errorf("verify --schema %s: exit %d, %v; want a refusal", bad[0], code, err)
		}
	}
}
