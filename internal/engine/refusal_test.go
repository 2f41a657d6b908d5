package engine_test

import (
	"net/url"
	"testing"

	. "github.com/pgconverge/pgconverge/internal/engine"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// requireNothingWritten requires that neither side holds anything a run writes: no slot, no
// publication but those listed in keep on the source, and no metadata schema, table or type on
// the target.
func requireNothingWritten(t *testing.T, env *pgtest.Env, keep ...string) {
	t.Helper()
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where database = current_database()`); n != 0 {
		t.Errorf("%d slots created despite the refusal", n)
	}
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_publication where pubname <> all($1)`, keep); n != 0 {
		t.Errorf("%d publications created despite the refusal", n)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_namespace where nspname = 'pgconverge'`); n != 0 {
		t.Error("the target's metadata schema was created despite the refusal")
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace
where n.nspname not in ('pg_catalog', 'information_schema', 'pg_toast') and c.relkind in ('r', 'p')`); n != 0 {
		t.Errorf("%d target tables created despite the refusal", n)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_type t join pg_namespace n on n.oid = t.typnamespace
where n.nspname = 'public' and t.typtype in ('e', 'd')`); n != 0 {
		t.Errorf("%d target types created despite the refusal", n)
	}
}

// withUser returns u with its user replaced by role.
func withUser(t *testing.T, u, role string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p.User = url.User(role)
	return p.String()
}

// tempRole creates login role name on conn's cluster with the attributes attrs, dropped (with what
// it owns) at cleanup.
func tempRole(t *testing.T, env *pgtest.Env, source bool, name, attrs string, grants ...string) {
	t.Helper()
	conn := env.Target
	if source {
		conn = env.Source
	}
	pgtest.Exec(t, conn, append([]string{`create role ` + name + ` login ` + attrs}, grants...)...)
	t.Cleanup(func() { pgtest.Exec(t, conn, `drop owned by `+name+` cascade`, `drop role `+name) })
}

// Every refusal that a check can find without writing comes before the run writes anything: on
// a fresh source and target, each leaves no slot, publication, metadata schema, target table or
// type behind (tables use an enum, which the run would create on the target first).
func TestRefusedRunWritesNothing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup func(t *testing.T, env *pgtest.Env, cfg *Config)
		keep  []string
		want  []string
	}{
		{"publication without deletes", func(t *testing.T, env *pgtest.Env, cfg *Config) {
			pgtest.Exec(t, env.Source, `create publication no_deletes for table a with (publish = 'insert, update, truncate')`)
			cfg.Publication = "no_deletes"
		}, []string{"no_deletes"}, []string{"does not publish every operation"}},
		{"partition of a root publication", func(t *testing.T, env *pgtest.Env, cfg *Config) {
			pgtest.Exec(t, env.Source, `create table p (id int primary key, m mood) partition by range (id)`,
				`create table p_low partition of p for values from (0) to (100)`,
				`create publication via_root for table a, p with (publish_via_partition_root = true)`)
			cfg.Publication, cfg.Tables = "via_root", []string{"a", "p_low"}
		}, []string{"via_root"}, []string{"publish_via_partition_root = true", "p_low"}},
		{"source role without REPLICATION", func(t *testing.T, env *pgtest.Env, cfg *Config) {
			role := env.Name + "_norepl"
			tempRole(t, env, true, role, "", `grant create on database `+env.Name+` to `+role, `alter table a owner to `+role)
			cfg.Source = withUser(t, env.SourceURL, role)
		}, nil, []string{"may not replicate", "REPLICATION"}},
		{"source role that does not own the table", func(t *testing.T, env *pgtest.Env, cfg *Config) {
			role := env.Name + "_notowner"
			tempRole(t, env, true, role, "replication", `grant create on database `+env.Name+` to `+role, `grant select on a to `+role)
			cfg.Source = withUser(t, env.SourceURL, role)
		}, nil, []string{"may not publish table public.a", "only its owner"}},
		{"source role without CREATE on the database", func(t *testing.T, env *pgtest.Env, cfg *Config) {
			role := env.Name + "_nocreate"
			tempRole(t, env, true, role, "replication", `revoke create on database `+env.Name+` from public`, `alter table a owner to `+role)
			cfg.Source = withUser(t, env.SourceURL, role)
		}, nil, []string{"may not create publication", "GRANT CREATE ON DATABASE"}},
		{"target role without CREATE", func(t *testing.T, env *pgtest.Env, cfg *Config) {
			role := env.Name + "_tgt"
			tempRole(t, env, false, role, "", `revoke create on database `+env.Name+` from public`, `revoke create on schema public from public`)
			cfg.Target = withUser(t, env.TargetURL, role)
		}, nil, []string{"may not create pgconverge's metadata schema", "may not create table public.a", `GRANT CREATE ON SCHEMA "public"`}},
		{"type the target lacks", func(t *testing.T, env *pgtest.Env, cfg *Config) {
			pgtest.Exec(t, env.Source, `create extension citext`, `alter table a add column email citext`)
		}, nil, []string{"table public.a uses type public.citext", `CREATE EXTENSION "citext" on the target`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // each case has its own databases and slot
			env := pgtest.New(t)
			pgtest.Exec(t, env.Source, `create type mood as enum ('sad', 'ok')`,
				`create table a (id int primary key, m mood)`, `insert into a values (1, 'ok')`)
			cfg := testConfig(t, env)
			c.setup(t, env, &cfg)
			requireRefusal(t, cfg, c.want...)
			requireNothingWritten(t, env, c.keep...)
		})
	}
}
