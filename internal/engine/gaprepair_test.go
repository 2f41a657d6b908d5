package engine_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	. "github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// gapRepairSetup creates table a (a key, 3,000 rows, row 20 with a TOASTed value) and keyless
// table b (REPLICA IDENTITY FULL, 100 rows), lets the daemon load and stream them until coverage
// is clean, stops it and drops its slot, as a failover to a standby without a synced slot leaves
// it.
func gapRepairSetup(t *testing.T, env *pgtest.Env) {
	t.Helper()
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text, big text)`,
		`alter table a alter column big set storage external`,
		`insert into a select g, 'v', null from generate_series(1, 3000) g`,
		`update a set big = (select string_agg(md5(g::text), '') from generate_series(1, 400) g) where id = 20`,
		`create table b (id int, v text)`, `alter table b replica identity full`,
		`insert into b select g % 50, 'v' from generate_series(1, 100) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.Exec(t, env.Source, `update a set v = 'streamed' where id = 50`)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitSlotCaughtUp(t, env)
	waitCovered(t, env)
	d.Stop(t)
	dropSlot(t, env)
}

// gapRepairChanges are the writes of the gap in table a: 20 keys differ afterwards (9 updated
// rows, 1 updated and raced by TestGapRepairWritesOnlyTheChangedKeys, 5 deleted, 3 inserted, a
// TOASTed value changed, a key deleted and inserted with other values), and 3 keys were written
// but end as they were (a key deleted and inserted again unchanged, a value changed and changed
// back, the inserted key 4004 deleted again).
var gapRepairChanges = []string{
	`update a set v = 'gap' where id between 1 and 10`,
	`delete from a where id between 11 and 15`,
	`insert into a select g, 'new', null from generate_series(4001, 4004) g`,
	`delete from a where id = 4004`,
	`update a set big = big || 'x' where id = 20`,
	`delete from a where id in (30, 31)`,
	`insert into a values (30, 'again', null), (31, 'v', null)`,
	`update a set v = 'w' where id = 40`, `update a set v = 'v' where id = 40`,
	`update b set v = 'gap' where id = 7`,
}

// repairSnapshot returns the snapshot LSN of table a's completed gap repair and its run's rows
// written, requiring exactly one completed gap-repair run.
func repairSnapshot(t *testing.T, env *pgtest.Env) (pglogrepl.LSN, int64) {
	t.Helper()
	rows := pgtest.Rows(t, env.Target, `select b.snapshot_lsn::text || ' ' || r.rows from pgconverge.backfills b
join pgconverge.backfill_runs r on r.id = b.run_id where r.trigger = 'gap-repair' and r.status = 'completed' and b.status = 'completed'`)
	if len(rows) != 1 {
		t.Fatalf("completed gap repairs: %q, want one of table a", rows)
	}
	var s string
	var n int64
	if _, err := fmt.Sscan(rows[0], &s, &n); err != nil {
		t.Fatal(err)
	}
	return lsnMust(t, s), n
}

// A slot dropped while the daemon was stopped (a failover to a standby without a synced slot) is
// a gap that --on-gap=repair closes by comparison at the new slot's snapshot S: exactly the keys
// that changed in the gap are written at (S, 0), tombstones for the deleted ones; equal rows,
// even ones written in the gap, are not; a source change made while the repair runs wins over the
// repair's write of its key; the keyless table falls back to a backfill; coverage has no gap.
func TestGapRepairWritesOnlyTheChangedKeys(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	gapRepairSetup(t, env)
	pgtest.Exec(t, env.Source, gapRepairChanges...)

	cfg := testConfig(t, env)
	cfg.OnGap = OnGapRepair
	var raced atomic.Bool
	raceErr := make(chan error, 1)
	cfg.Knobs.BeforeGapRepairBatch = func(table string, _ int64) {
		if table != "public.a" || raced.Swap(true) {
			return
		}
		// Committed before the repair reads key 1 at S, which does not show it: the repair
		// writes the gap's value at (S, 0), and the stream must then apply this one over it.
		conn, err := pgx.Connect(context.Background(), env.SourceURL)
		if err == nil {
			_, err = conn.Exec(context.Background(), `update a set v = 'raced' where id = 1`)
			conn.Close(context.Background())
		}
		raceErr <- err
	}
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitConverged(t, env, "b", "id, v")
	rep := waitCovered(t, env)
	select {
	case err := <-raceErr:
		if err != nil {
			t.Fatalf("the racing source update: %v", err)
		}
	default:
		t.Fatal("the gap repair wrote no batch of table a")
	}

	s, written := repairSnapshot(t, env)
	if written != 20 {
		t.Errorf("the gap-repair run wrote %d rows, want 20", written)
	}
	// Keys 2–10 (updated), 11–15 (tombstones), 20 (TOAST), 30 (inserted again), 4001–4003
	// (inserted), 4004 (inserted and deleted: absent from the target, so not written) at (S, 0).
	want := []string{}
	for _, k := range []int{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 20, 30, 4001, 4002, 4003} {
		want = append(want, strconv.Itoa(k))
	}
	got := pgtest.Rows(t, env.Target, fmt.Sprintf(`select id::text from a where _cdc_lsn = '%s' and _cdc_seq = 0 order by a.id`, s))
	if d := pgtest.Diff(want, got); d != "" {
		t.Errorf("keys written at the repair's snapshot %s: %s", s, d)
	}
	got = pgtest.Rows(t, env.Target, fmt.Sprintf(`select id::text || ' ' || v from a where _cdc_lsn > '%s'`, s))
	if d := pgtest.Diff([]string{"1 raced"}, got); d != "" {
		t.Errorf("keys the stream wrote after the repair: %s", d)
	}
	if n := pgtest.Scalar[int64](t, env.Target, fmt.Sprintf(`select count(*) from a where _cdc_lsn < '%s'`, s)); n != 3003-20 {
		t.Errorf("%d target rows of a older than the repair, want %d (every key but the 20 that differed)", n, 3003-20)
	}
	if n := pgtest.Scalar[int64](t, env.Target, fmt.Sprintf(`select count(*) from a where _cdc_lsn = '%s' and _cdc_deleted`, s)); n != 5 {
		t.Errorf("%d tombstones at the repair's snapshot, want 5", n)
	}
	if b := tableReport(t, rep, "public.a").BackfillLSN; b == nil || pglogrepl.LSN(*b) != s {
		t.Errorf("public.a backfill LSN %v, want the repair's snapshot %s", b, s)
	}
	// The keyless table was backfilled instead, at the same snapshot.
	got = pgtest.Rows(t, env.Target, `select r.trigger || ' ' || b.table_name || ' ' || (b.snapshot_lsn = (select x.snapshot_lsn from pgconverge.backfills x
  join pgconverge.backfill_runs y on y.id = x.run_id where y.trigger = 'gap-repair'))::text
from pgconverge.backfills b join pgconverge.backfill_runs r on r.id = b.run_id where r.trigger in ('gap', 'gap-repair') order by b.id`)
	if d := pgtest.Diff([]string{"gap-repair a true", "gap b true"}, got); d != "" {
		t.Errorf("gap runs: %s", d)
	}
}

// A gap repair killed with SIGKILL after its first write transaction leaves a gap; the restarted
// daemon repairs again at a new snapshot S2, writes only the keys the killed repair had not
// written (those it wrote are equal at S2), and closes the gap.
func TestGapRepairKilledIsFinishedAfterARestart(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	gapRepairSetup(t, env)
	loaded := lsnMust(t, pgtest.Scalar[string](t, env.Target, `select max(snapshot_lsn)::text from pgconverge.backfills`))
	// 1,520 keys differ: more than one write transaction's RepairBatchRows.
	pgtest.Exec(t, env.Source, append(gapRepairChanges, `update a set v = 'many' where id between 1001 and 2500`)...)
	out, err := crashChildCmd(env, "during-gap-repair", 1).CombinedOutput()
	requireKilled(t, err, out)
	written := fmt.Sprintf(`select count(*) from a where _cdc_seq = 0 and _cdc_lsn > '%s'`, loaded)
	before := pgtest.Scalar[int64](t, env.Target, written)
	if before == 0 || before >= 1520 {
		t.Fatalf("%d keys written by the killed repair, want some of the 1,520", before)
	}
	if _, code := coverageOf(t, env); code != exitGap {
		t.Fatalf("coverage exit %d after the killed repair, want 3", code)
	}

	cfg := testConfig(t, env)
	cfg.OnGap = OnGapRepair
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitConverged(t, env, "b", "id, v")
	waitCovered(t, env)
	s2, rows := repairSnapshot(t, env)
	atS2 := pgtest.Scalar[int64](t, env.Target, fmt.Sprintf(`select count(*) from a where _cdc_seq = 0 and _cdc_lsn = '%s'`, s2))
	if atS2 != 1520-before || rows != atS2 {
		t.Errorf("the restarted repair wrote %d rows (%d at S2 %s), want the %d the killed one had not written", rows, atS2, s2, 1520-before)
	}
	if n := pgtest.Scalar[int64](t, env.Target, written); n != 1520 {
		t.Errorf("%d keys written by the two repairs, want 1,520", n)
	}
	got := pgtest.Rows(t, env.Target, `select trigger || ' ' || status from pgconverge.backfill_runs where trigger like 'gap%' order by id`)
	if d := pgtest.Diff([]string{"gap-repair failed", "gap-repair completed", "gap completed"}, got); d != "" {
		t.Errorf("gap runs: %s", d)
	}
}

// A gap in which more keys changed than verify.GapRepairMinKeys (and GapRepairMaxShare of the
// table) is backfilled instead: the repair stops before writing past the limit, the backfill
// reads the same snapshot, and the gap closes.
func TestGapRepairOfMostRowsFallsBackToABackfill(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `insert into a select g, 'v' from generate_series(1, 15000) g`)
	d := startDaemon(t, testConfig(t, env))
	pgtest.WaitConverged(t, env, "a", "id")
	pgtest.WaitSlotCaughtUp(t, env)
	waitCovered(t, env)
	d.Stop(t)
	dropSlot(t, env)
	pgtest.Exec(t, env.Source, `update a set v = 'gap' where id <= 12000`)
	cfg := testConfig(t, env)
	cfg.OnGap = OnGapRepair
	startDaemon(t, cfg)
	pgtest.WaitConverged(t, env, "a", "id")
	waitCovered(t, env)
	got := pgtest.Rows(t, env.Target, `select r.trigger || ' ' || r.status || ' ' || (r.rows <= 10000)::text || ' ' || count(b.id)
from pgconverge.backfill_runs r left join pgconverge.backfills b on b.run_id = r.id where r.trigger like 'gap%' group by r.id order by r.id`)
	if d := pgtest.Diff([]string{"gap-repair completed true 0", "gap completed false 1"}, got); d != "" {
		t.Errorf("gap runs (trigger, status, rows <= 10000, tables): %s", d)
	}
}
