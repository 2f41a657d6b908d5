package engine_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

func TestStreamInsertUpdateDeleteAndKeyChange(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table items (id int primary key, body text, n int)`,
		`insert into items select g, 'item ' || g, g from generate_series(1, 500) g`,
		`create table pairs (a int, b text, v numeric, primary key (a, b))`,
		`insert into pairs select g % 7, 'k' || g, g / 3.0 from generate_series(1, 100) g`,
		`create table no_key (x int)`,
	)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env) // the loads are over
	pgtest.WaitConverged(t, env, "items", "id")
	pgtest.WaitConverged(t, env, "pairs", "a, b")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from items where _cdc_seq <> 0`); n != 0 {
		t.Errorf("%d loaded rows have a stream version, want all at (S, 0)", n)
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.tables where loaded_lsn is not null and snapshot_only is null`); n != 2 {
		t.Errorf("%d streamed tables recorded as loaded, want 2 (no_key has no primary key and is kept by snapshots)", n)
	}
	pgtest.Exec(t, env.Source,
		`insert into items values (1001, 'new', 1), (1002, 'new', 2)`,
		`update items set body = 'changed', n = n * 10 where id % 10 = 0`,
		`delete from items where id between 100 and 120`,
		`begin; update items set n = null where id = 1; delete from items where id = 2; insert into items values (2, 're-added', 2); commit`,
		`update items set id = id + 5000 where id <= 5`,
		`update pairs set b = b || '!' where a = 3`,
		`delete from pairs where a = 4`,
	)
	pgtest.WaitConverged(t, env, "items", "id")
	pgtest.WaitConverged(t, env, "pairs", "a, b")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from items where _cdc_deleted and id <= 5`); n != 5 {
		t.Errorf("%d tombstones for the old keys of the key change, want 5", n)
	}
	pgtest.WaitSlotCaughtUp(t, env)
}

func TestTruncateThenInsert(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table items (id int primary key, body text)`,
		`insert into items select g, 'old ' || g from generate_series(1, 300) g`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "items", "id")
	pgtest.Exec(t, env.Source,
		`begin; truncate items; insert into items select g, 'after ' || g from generate_series(250, 400) g; commit`)
	pgtest.WaitConverged(t, env, "items", "id")
	pgtest.Exec(t, env.Source,
		`truncate items`,
		`insert into items values (1, 'one'), (301, 'three hundred one')`)
	pgtest.WaitConverged(t, env, "items", "id")
	if fence := pgtest.Scalar[string](t, env.Target, `select fence_lsn::text from pgconverge.tables where table_name = 'items'`); fence == "0/0" {
		t.Error("no truncate fence recorded")
	}
}

func TestUnchangedToastColumnKeepsItsValue(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table docs (id int primary key, body text, n int)`,
		// EXTERNAL: stored out of line without compression, so pgoutput sends it as unchanged.
		`alter table docs alter column body set storage external`,
		`insert into docs select g, repeat(md5(g::text), 100), 0 from generate_series(1, 20) g`)
	cfg := testConfig(t, env)
	var toasted atomic.Int64
	cfg.Knobs.Stream.OnMessage = func(m pglogrepl.Message) {
		if u, ok := m.(*pglogrepl.UpdateMessage); ok {
			for _, c := range u.NewTuple.Columns {
				if c.DataType == pglogrepl.TupleDataTypeToast {
					toasted.Add(1)
				}
			}
		}
	}
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "docs", "id")
	pgtest.Exec(t, env.Source,
		`insert into docs select g, repeat(md5(g::text), 100), 0 from generate_series(21, 30) g`,
		`update docs set n = n + 1`,
		`update docs set n = n + 1 where id % 2 = 0`)
	pgtest.WaitConverged(t, env, "docs", "id")
	if toasted.Load() == 0 {
		t.Fatal("the source sent no unchanged TOAST value: the test did not test anything")
	}
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from docs where body is null or _cdc_unknown is not null`); n != 0 {
		t.Errorf("%d target rows lost their TOASTed value", n)
	}
}

func TestRefusesBadSourceWithClearError(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table parted (x int) partition by range (x)`, `create table ok (id int primary key)`)
	cases := []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{"partitioned table without primary key", func(c *Config) { c.Tables = []string{"public.parted", "ok"} },
			[]string{"public.parted", "no primary key", "ADD PRIMARY KEY"}},
		{"missing table", func(c *Config) { c.Tables = []string{"public.nope"} },
			[]string{"public.nope does not exist"}},
		{"wal_level not logical", func(c *Config) { c.Source = env.TargetURL; c.Target = env.SourceURL },
			[]string{"wal_level", "logical"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t, env)
			c.mutate(&cfg)
			requireRefusal(t, cfg, c.want...)
		})
	}
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where database = current_database()`); n != 0 {
		t.Errorf("%d slots created despite the refusal", n)
	}
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_publication`); n != 0 {
		t.Errorf("%d publications created despite the refusal", n)
	}
}

func TestIdleSourceAdvancesConfirmedFlush(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table items (id int primary key)`, `create table noise (id int primary key, pad text)`)
	cfg := testConfig(t, env)
	cfg.Tables = []string{"public.items"}
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `insert into noise select g, repeat('x', 200) from generate_series(1, 20000) g`)
	lsn := pgtest.WaitSlotCaughtUp(t, env)
	// The target recorded the position before the source was told (exactly-once rule).
	if !pgtest.Scalar[bool](t, env.Target, `select applied_lsn >= $1::pg_lsn from pgconverge.progress where slot = $2`, lsn, env.Name) {
		t.Errorf("the slot confirmed %s but the target's progress is behind it", lsn)
	}
}

// On an idle source every new WAL end reaches the target's progress within the idle-progress
// throttle (1 s), not the status interval (10 s): a keepalive that came while the throttle was on
// is recorded once it is off. Five WAL ends in a row, each waited for with less time than a
// status interval.
func TestIdleWatermarkFollowsEveryKeepalive(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table items (id int primary key)`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	for i := 0; i < 5; i++ {
		// An xid's commit (an empty transaction, which pgoutput skips) writes and flushes WAL.
		pgtest.Exec(t, env.Source, `select pg_current_xact_id()`)
		lsn := pgtest.Scalar[string](t, env.Source, `select pg_current_wal_insert_lsn()::text`)
		pgtest.Eventually(t, 5*time.Second, "the target's progress reaches "+lsn, func() (bool, string) {
			var ok bool
			var at string
			err := env.Target.QueryRow(t.Context(), `select applied_lsn >= $1::pg_lsn, applied_lsn::text from pgconverge.progress where slot = $2`, lsn, env.Name).Scan(&ok, &at)
			if err != nil {
				return false, err.Error()
			}
			return ok, at
		})
	}
}

func TestClusterRestartMidStream(t *testing.T) {
	for _, side := range []string{"target", "source"} {
		t.Run(side, func(t *testing.T) {
			env := pgtest.New(t)
			pgtest.Exec(t, env.Source, `create table items (id int primary key, n int)`)
			cfg := testConfig(t, env)
			cfg.Knobs.RetryBackoffMax = 2 * time.Second // reconnects soon once the cluster is back
			d := startDaemon(t, cfg)
			pgtest.WaitStreaming(t, env)
			pgtest.Exec(t, env.Source, `insert into items select g, g from generate_series(1, 1000) g`)
			pgtest.Restart(t, side)
			env.Source = pgtest.Connect(t, env.SourceURL)
			env.Target = pgtest.Connect(t, env.TargetURL)
			pgtest.Exec(t, env.Source,
				`update items set n = n + 1 where id % 3 = 0`,
				`insert into items select g, g from generate_series(1001, 2000) g`)
			pgtest.WaitConverged(t, env, "items", "id")
			pgtest.WaitSlotCaughtUp(t, env)
			d.RequireRunning(t)
		})
	}
}

// At the head of the stream a burst of transactions that arrives while the target is busy is
// applied in groups of at most HeadGroupRows changes (plus the transaction that reached the
// bound), so the target's position moves as each commits instead of once at the burst's end.
// The target is held busy (Knobs.Stream.OnGroup blocks) until every transaction the cap lets
// the stream read has arrived: without the cap the stream would read the whole burst into one
// group meanwhile.
func TestBurstAtTheHeadIsAppliedInSmallGroups(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table burst (id int primary key, txn int)`)
	cfg := testConfig(t, env)
	const perTxn, txns, headRows = 300, 12, 1000
	var (
		mu      sync.Mutex
		groups  []int // changes of each group formed at the head after the gate was armed
		gated   bool
		commits int
	)
	blocked, release := make(chan struct{}), make(chan struct{})
	cfg.Knobs.Stream.OnMessage = func(m pglogrepl.Message) {
		if _, ok := m.(*pglogrepl.CommitMessage); ok {
			mu.Lock()
			commits++
			mu.Unlock()
		}
	}
	var head atomic.Bool
	cfg.Knobs.Stream.OnGroup = func(changes int, atHead bool) {
		head.Store(atHead)
		mu.Lock()
		if !gated {
			mu.Unlock()
			return
		}
		first := groups == nil
		if atHead {
			groups = append(groups, changes)
		} else {
			groups = append(groups, -changes)
		}
		mu.Unlock()
		if first {
			close(blocked)
			<-release
		}
	}
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	// The stream starts behind; it is at the head once a group formed there.
	n := 0
	pgtest.Eventually(t, 30*time.Second, "a group formed at the head", func() (bool, string) {
		n++
		pgtest.Exec(t, env.Source, fmt.Sprintf(`insert into burst values (%d, 0)`, -n))
		return head.Load(), ""
	})
	pgtest.WaitConverged(t, env, "burst", "id")
	mu.Lock()
	gated = true
	mu.Unlock()
	pgtest.Exec(t, env.Source, `insert into burst values (0, 0)`)
	<-blocked
	mu.Lock()
	before := commits
	mu.Unlock()
	for i := 1; i <= txns; i++ {
		pgtest.Exec(t, env.Source, fmt.Sprintf(`insert into burst select %d * 1000 + g, %d from generate_series(1, %d) g`, i, i, perTxn))
	}
	// The cap lets the stream read transactions until it holds headRows changes; then it waits.
	readable := (headRows + perTxn - 1) / perTxn
	pgtest.Eventually(t, 30*time.Second, "the stream read the transactions the cap allows", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return commits-before >= readable, fmt.Sprintf("%d commits read", commits-before)
	})
	// Give an uncapped stream the time to read the whole burst: the walsender has sent it all.
	end := pgtest.Scalar[string](t, env.Source, `select pg_current_wal_lsn()::text`)
	pgtest.Eventually(t, 30*time.Second, "the walsender sent the burst", func() (bool, string) {
		return pgtest.Scalar[bool](t, env.Source, `select coalesce((select r.sent_lsn >= $1::pg_lsn from pg_replication_slots s
join pg_stat_replication r on r.pid = s.active_pid where s.slot_name = $2), false)`, end, env.Name), ""
	})
	close(release)
	pgtest.WaitConverged(t, env, "burst", "id")
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, g := range groups[1:] {
		if g < 0 || g > readable*perTxn {
			t.Errorf("groups after the gate %v: each at the head and of at most %d changes", groups, readable*perTxn)
			break
		}
		total += g
	}
	if groups[0] != 1 || total != perTxn*txns {
		t.Errorf("groups after the gate %v: want the gated one row, then %d changes in all", groups, perTxn*txns)
	}
}
