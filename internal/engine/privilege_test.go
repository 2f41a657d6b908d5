package engine_test

import (
	"testing"

	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/verify"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// The least privileges docs/security.md's "Roles and privileges" names are enough for the daemon, a backfill,
// verify with repair and status: a source role with LOGIN, REPLICATION and SELECT on the tables
// (the publication made by the tables' owner), and a target role with CREATE on the database and
// its schema; neither is a superuser.
func TestLeastPrivilegeRoles(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	src, tgt := env.Name+"_src", env.Name+"_tgt"
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `insert into a select g, 'v' from generate_series(1, 100) g`,
		`create publication `+env.Name+` for table a`)
	tempRole(t, env, true, src, "replication", `grant select on a to `+src)
	tempRole(t, env, false, tgt, "", `grant create on database `+env.Name+` to `+tgt, `grant create on schema public to `+tgt)
	cfg := testConfig(t, env)
	cfg.Source, cfg.Target = withUser(t, env.SourceURL, src), withUser(t, env.TargetURL, tgt)
	if pgtest.Scalar[bool](t, env.Source, `select rolsuper from pg_roles where rolname = $1`, src) {
		t.Fatal("the source role is a superuser")
	}
	d := startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `update a set v = 'w' where id <= 10`, `delete from a where id > 90`, `insert into a values (500, 'new')`)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.Exec(t, env.Target, `update a set v = 'drift' where id = 50`)
	rep, err := verify.Run(t.Context(), verify.Config{Source: cfg.Source, Target: cfg.Target, Repair: true, Logger: cfg.Logger})
	if err != nil || rep.Found != 1 || rep.Repaired != 1 {
		t.Fatalf("verify --repair as the least-privileged roles: %+v, %v; want 1 found and repaired", rep, err)
	}
	pgtest.WaitConverged(t, env, "a", "id")
	if _, err := operator.Status(t.Context(), operator.StatusConfig{Source: cfg.Source, Target: cfg.Target, Slot: cfg.Slot}); err != nil {
		t.Errorf("status as the least-privileged roles: %v", err)
	}
	d.Stop(t)
}
