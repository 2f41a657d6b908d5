package migrations_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/migrations"
)

// Processes that start at once on a new target (two daemons, a backfill and a joined worker) all
// bring its schema up: none fails on another's concurrent creation of the schema or its tables.
func TestApplyFromSeveralProcessesAtOnce(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("the migration files: %v, %v", files, err)
	}
	for round := range 5 {
		env := pgtest.New(t)
		conns := make([]*pgx.Conn, 6)
		for i := range conns {
			conns[i] = pgtest.Connect(t, env.TargetURL)
		}
		var wg sync.WaitGroup
		errs := make([]error, len(conns))
		start := make(chan struct{})
		for i, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = migrations.Apply(context.Background(), c)
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, process %d: %v", round, i, err)
			}
		}
		if n := pgtest.Scalar[int64](t, env.Target, `select max(version) from pgconverge.schema_version`); n != int64(len(files)) {
			t.Fatalf("round %d: schema version %d, want the newest, %d", round, n, len(files))
		}
	}
}
