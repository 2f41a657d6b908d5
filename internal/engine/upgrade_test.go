package engine_test

import (
	"context"
	"testing"

	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/migrations"
)

// A daemon describes its tables before it brings the target's metadata schema up to date (it
// writes nothing before its checks passed), so it reads a schema of an older version: one left by
// an older release, or by a daemon killed between two migrations. Version 7 predates the tables
// kept by snapshots (snapshot_only) and retirements (retired_at).
func TestDaemonStartsOnAnOlderMetadataSchema(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v int)`, `insert into a select g, g from generate_series(1, 100) g`)
	if err := migrations.ApplyTo(context.Background(), env.Target, 7); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
}
