package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/internal/verify"
)

// indexCounter is a Monitor that counts the index follower's results.
type indexCounter struct {
	NopMonitor
	mu sync.Mutex
	n  map[string]int
}

func (m *indexCounter) TargetIndex(_, result string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == nil {
		m.n = map[string]int{}
	}
	m.n[result]++
}

func (m *indexCounter) count(result string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n[result]
}

// targetIndexDefs returns table's indexes on db as "name: definition", by name.
func targetIndexDefs(t *testing.T, env *pgtest.Env, table string) []string {
	t.Helper()
	return pgtest.Rows(t, env.Target, `select c.relname || ': ' || pg_get_indexdef(i.indexrelid) from pg_index i
join pg_class c on c.oid = i.indexrelid where i.indrelid = '`+table+`'::regclass and i.indisvalid order by 1`)
}

// waitIndexes polls until table's valid indexes on the target are want.
func waitIndexes(t *testing.T, env *pgtest.Env, table string, want ...string) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, "the indexes of "+table+" on the target", func() (bool, string) {
		d := pgtest.Diff(want, targetIndexDefs(t, env, table))
		return d == "", d
	})
}

// With --copy-indexes the daemon builds the source's secondary indexes on a loaded target table,
// a unique one as a twin without its uniqueness (so that a transaction that swaps two rows'
// unique values streams through), follows an index created and one dropped on the source, leaves
// an index of the operator's alone, logs an index it cannot build and goes on streaming; cutover
// --finalize then makes the unique index unique and drops the twin.
func TestCopyIndexesFollowsTheSource(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table t (id int primary key, email text, score int, note text)`,
		`create unique index t_email_key on t (email)`,
		`create index t_score_idx on t (score desc) where score > 0`,
		`insert into t select g, 'u' || g || '@x', g % 7, 'n' from generate_series(1, 2000) g`)
	cfg := testConfig(t, env)
	cfg.CopyIndexes = true
	cfg.Knobs.IndexFollowEvery = 200 * time.Millisecond
	mon := &indexCounter{}
	cfg.Monitor = mon
	d := startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "t", "id")
	waitIndexes(t, env, "t",
		"_cdc_t_email_key: CREATE INDEX _cdc_t_email_key ON public.t USING btree (email)",
		"t_pkey: CREATE UNIQUE INDEX t_pkey ON public.t USING btree (id)",
		"t_score_idx: CREATE INDEX t_score_idx ON public.t USING btree (score DESC) WHERE (score > 0)")

	// Swapping two unique values in one transaction: applied as a set, the target's rows are
	// briefly duplicates, which a unique index would refuse.
	pgtest.Exec(t, env.Source, `begin`, `update t set email = 'tmp' where id = 1`, `update t set email = 'u1@x' where id = 2`,
		`update t set email = 'u2@x' where id = 1`, `commit`)
	pgtest.Exec(t, env.Target, `create index mine on t (note)`)
	pgtest.Exec(t, env.Source, `drop index t_score_idx`, `create index t_note_idx on t (note, score)`,
		`create function f(int) returns int immutable language sql as 'select $1 * 2'`, `create index t_f_idx on t (f(score))`,
		`insert into t values (5000, 'late@x', 1, 'late')`)
	pgtest.WaitConverged(t, env, "t", "id")
	waitIndexes(t, env, "t",
		"_cdc_t_email_key: CREATE INDEX _cdc_t_email_key ON public.t USING btree (email)",
		"mine: CREATE INDEX mine ON public.t USING btree (note)",
		"t_note_idx: CREATE INDEX t_note_idx ON public.t USING btree (note, score)",
		"t_pkey: CREATE UNIQUE INDEX t_pkey ON public.t USING btree (id)")
	pgtest.Eventually(t, 10*time.Second, "the index whose function the target lacks counted as failed", func() (bool, string) {
		return mon.count("failed") > 0, ""
	})
	rep, err := verify.Schema(context.Background(), verify.Config{Source: env.SourceURL, Target: env.TargetURL})
	if err != nil || schemaKinds(rep, false) != "public.t index t_f_idx, public.t index mine" {
		t.Errorf("verify --schema while replicating: %v, differences %q; want the index the target cannot build and the operator's", err, schemaKinds(rep, false))
	}
	d.Stop(t)

	pgtest.Exec(t, env.Target, `create function f(int) returns int immutable language sql as 'select $1 * 2'`, `drop index mine`)
	if _, err := operator.Cutover(context.Background(), operator.CutoverConfig{Run: cfg, DropSlot: true, Finalize: true}); err != nil {
		t.Fatalf("cutover --finalize: %v", err)
	}
	waitIndexes(t, env, "t",
		"t_email_key: CREATE UNIQUE INDEX t_email_key ON public.t USING btree (email)",
		"t_f_idx: CREATE INDEX t_f_idx ON public.t USING btree (f(score))",
		"t_note_idx: CREATE INDEX t_note_idx ON public.t USING btree (note, score)",
		"t_pkey: CREATE UNIQUE INDEX t_pkey ON public.t USING btree (id)")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.target_indexes`); n != 0 {
		t.Errorf("%d indexes still recorded after finalize", n)
	}
}
