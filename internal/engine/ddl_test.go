package engine_test

import (
	"context"
	"sync"
	"testing"

	"github.com/pgconverge/pgconverge/internal/backfillrun"

	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/migrations"
)

// Processes that set up the same new target tables at once (two daemons, or a daemon and a
// backfill, started together on a new target) all succeed: none fails on another's concurrent
// creation of a table, its schema or a type it uses.
func TestTablesSetUpByProcessesAtOnce(t *testing.T) {
	t.Parallel()
	for range 3 {
		env := pgtest.New(t)
		pgtest.Exec(t, env.Source, `create schema app`, `create type app.mood as enum ('sad', 'ok', 'happy')`,
			`create table app.a (id int primary key, m app.mood)`, `create table app.b (id int primary key, m app.mood)`,
			`create table c (id int primary key, v text)`)
		var tables []changebatch.Table
		for _, n := range [][2]string{{"app", "a"}, {"app", "b"}, {"public", "c"}} {
			tab, err := cdc.DescribeTable(context.Background(), env.Source, n[0], n[1])
			if err != nil {
				t.Fatal(err)
			}
			tables = append(tables, tab)
		}
		const processes = 5
		errs := make([]error, processes)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range processes {
			src, tgt := pgtest.Connect(t, env.SourceURL), pgtest.Connect(t, env.TargetURL)
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if errs[i] = migrations.Apply(context.Background(), tgt); errs[i] == nil {
					_, errs[i] = backfillrun.EnsureTables(context.Background(), src, tgt, tables, testConfig(t, env).Logger)
				}
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("process %d: %v", i, err)
			}
		}
		if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.tables`); n != 3 {
			t.Fatalf("%d tables registered, want 3", n)
		}
	}
}
