package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/verify"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// waitSameMultiset polls until the target's live rows of table are the source's rows as a
// multiset: each distinct row (as row(...)::text of the source's columns) with its count.
func waitSameMultiset(t *testing.T, env *pgtest.Env, table string) {
	t.Helper()
	cols := pgtest.SourceColumns(t, env.Source, table)
	q := func(where string) string {
		return `select r || ' x' || count(*) from (select row(` + cols + `)::text as r from ` + table + where + `) s group by r order by r collate "C"`
	}
	pgtest.WaitSameRows(t, env, "target "+table+" holds the source's multiset of rows", q(""), q(" where not _cdc_deleted"), multisetDiff)
}

// multisetDiff describes up to five lines that only one of want (the source's) and got (the
// target's) has, or returns "" when they are the same.
func multisetDiff(want, got []string) string {
	in := map[string]int{}
	for _, w := range want {
		in[w]++
	}
	for _, g := range got {
		in[g]--
	}
	var out []string
	for line, n := range in {
		if n > 0 && len(out) < 5 {
			out = append(out, "source only: "+line)
		} else if n < 0 && len(out) < 5 {
			out = append(out, "target only: "+line)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// keylessEvents creates a table without a key, REPLICA IDENTITY FULL, with duplicates, NULLs, a
// json and a point column (neither has equality) and a TOASTed value.
func keylessEvents(t *testing.T, env *pgtest.Env) {
	pgtest.Exec(t, env.Source,
		`create table events (kind text, n int, doc json, at point, note text)`,
		`alter table events replica identity full`,
		`insert into events values ('a', 1, '{"x": 1}', '(1,2)', null), ('a', 1, '{"x": 1}', '(1,2)', null), ('a', 1, '{"x": 1}', '(1,2)', null)`,
		`insert into events values ('b', null, null, null, ''), ('b', null, null, null, ''), (null, null, null, null, null)`,
		// json keeps its text: these two are different rows although equal as jsonb.
		`insert into events values ('j', 1, '{"x":1}', null, null), ('j', 1, '{"x": 1}', null, null)`,
		`insert into events select 'g' || (g % 50), g % 7, null, point(g % 3, 0), null from generate_series(1, 1500) g`,
		`insert into events values ('toast', 1, null, null, (select string_agg(md5(g::text), '') from generate_series(1, 400) g))`)
}

// A table without a key, REPLICA IDENTITY FULL, converges as a multiset: the initial load,
// duplicates inserted, one of several equal rows deleted or updated (by ctid), an UPDATE that
// changes nothing, NULLs everywhere, a TOASTed value left unchanged by an UPDATE of another
// column, a TRUNCATE; a restart replays nothing twice and a manual backfill while the stream
// runs doubles nothing.
func TestKeylessTableConverges(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	keylessEvents(t, env)
	d := startDaemon(t, testConfig(t, env))
	waitSameMultiset(t, env, "events")
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source,
		`insert into events values ('a', 1, '{"x": 1}', '(1,2)', null), ('a', 1, '{"x": 1}', '(1,2)', null)`,
		`delete from events where ctid = (select ctid from events where kind = 'a' limit 1)`,
		`update events set n = 5 where ctid = (select ctid from events where kind = 'b' limit 1)`,
		`update events set n = n where kind = 'g1'`,
		`update events set kind = null, n = null, at = null where ctid = (select ctid from events where kind = 'g2' limit 1)`,
		`update events set n = 2 where kind = 'toast'`,
		`begin; insert into events values ('t', 1, null, null, null); delete from events where kind = 't';
		 insert into events values ('t', 1, null, null, null), ('t', 1, null, null, null);
		 update events set n = 9 where ctid = (select ctid from events where kind = 't' limit 1); commit`,
		`delete from events where kind = 'g3'`)
	waitSameMultiset(t, env, "events")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from events where kind = 'toast' and n = 2 and length(note) = 12800 and not _cdc_deleted`); n != 1 {
		t.Errorf("%d live toast rows with n = 2 and the whole note, want 1", n)
	}
	// A restart resumes from the target's progress: whatever is replayed is suppressed.
	d.Stop(t)
	pgtest.Exec(t, env.Source, `delete from events where ctid = (select ctid from events where kind = 'a' limit 1)`)
	d = startDaemon(t, testConfig(t, env))
	waitSameMultiset(t, env, "events")
	// A backfill while the stream changes the table: neither path doubles or drops a copy. The
	// 'late' copies are the table's last rows, in the backfill's last batch: a DELETE and an
	// UPDATE of one of them are streamed after the backfill's snapshot and applied before that
	// batch, so they take copies the snapshot replaces, and the batch must leave them taken.
	pgtest.Exec(t, env.Source, `insert into events select 'late', 1, null, null, null from generate_series(1, 5)`)
	waitSameMultiset(t, env, "events")
	stop := keylessWorkload(t, env)
	cfg := testBackfillConfig(t, env, "public.events")
	cfg.ChunkRows = 200
	var once sync.Once
	hookErr := make(chan error, 1)
	cfg.AfterMergedBatch = func() { once.Do(func() { hookErr <- streamPastBatch(env) }) }
	backfillNow(t, cfg)
	if err := <-hookErr; err != nil {
		t.Fatal(err)
	}
	stop()
	waitSameMultiset(t, env, "events")
	pgtest.Exec(t, env.Source, `truncate events`, `insert into events values ('after', 1, null, null, null)`)
	waitSameMultiset(t, env, "events")
	waitCovered(t, env)
	d.Stop(t)
}

// streamPastBatch deletes one 'late' copy of events and updates another on the source and waits
// until the target holds 3 unchanged ones.
func streamPastBatch(env *pgtest.Env) error {
	ctx := context.Background()
	for _, sql := range []string{`delete from events where ctid = (select ctid from events where kind = 'late' limit 1)`,
		`update events set n = 2 where ctid = (select ctid from events where kind = 'late' and n = 1 limit 1)`} {
		if _, err := env.Source.Exec(ctx, sql); err != nil {
			return err
		}
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var n int64
		if err := env.Target.QueryRow(ctx, `select count(*) from events where kind = 'late' and n = 1 and not _cdc_deleted`).Scan(&n); err != nil {
			return err
		}
		if n == 3 {
			return nil
		}
	}
	return fmt.Errorf("the stream did not apply the delete and update of 'late' copies within 30 s")
}

// keylessWorkload changes the events table until stopped: each transaction inserts two copies of
// a value, deletes one copy of another and updates one copy of a third, by ctid.
func keylessWorkload(t *testing.T, env *pgtest.Env) (stop func()) {
	return sourceLoop(t, env, func(ctx context.Context, tx pgx.Tx, i int) error {
		if _, err := tx.Exec(ctx, `insert into events values ($1, 1, null, null, 'w'), ($1, 1, null, null, 'w')`, fmt.Sprintf("g%d", i%50)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `delete from events where ctid = (select ctid from events where kind = $1 limit 1)`, fmt.Sprintf("g%d", (i+17)%50)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `update events set n = n + 1 where ctid = (select ctid from events where kind = $1 limit 1)`, fmt.Sprintf("g%d", (i+31)%50))
		return err
	})
}

// A daemon killed with SIGKILL again and again while it streams a keyless table with duplicates
// loses and doubles no copy; after the slot is dropped, the gap backfill of --on-gap=backfill
// brings the table back to the source's multiset.
func TestKeylessKilledWhileStreamingAndGapBackfilled(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	keylessEvents(t, env)
	stop := keylessWorkload(t, env)
	for _, kill := range []struct {
		point string
		at    int
	}{{"during-load", 1}, {"mid-transaction", 40}, {"after-commit", 10}, {"after-begin", 30}} {
		out, err := crashChildCmd(env, kill.point, kill.at).CombinedOutput()
		requireKilled(t, err, out)
	}
	child := crashChildCmd(env, "none", 0)
	var out bytes.Buffer
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the moment of the kill is the point
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	requireKilled(t, child.Wait(), out.Bytes())
	d := startDaemon(t, testConfig(t, env))
	stop()
	waitSameMultiset(t, env, "events")
	waitCovered(t, env)
	d.Stop(t)

	dropSlot(t, env)
	before := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
	stop = keylessWorkload(t, env)
	pgtest.Eventually(t, 30*time.Second, "the workload wrote while no slot kept its changes", func() (bool, string) {
		now := lsnOf(t, env, `select pg_current_wal_insert_lsn()::text`)
		return now > before+64<<10, now.String()
	})
	d = startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	stop()
	waitSameMultiset(t, env, "events")
	rep := waitCovered(t, env)
	if tr := tableReport(t, rep, "public.events"); tr.BackfillLSN == nil || tr.StreamStartLSN == nil || *tr.BackfillLSN < *tr.StreamStartLSN {
		t.Errorf("after the gap: %+v, want a backfill at or after the new stream's start", tr)
	}
	d.Stop(t)
}

// verify compares a keyless table as a multiset while the stream runs: a copy lost, a copy too
// many and a copy whose value changed on the target are found as one discrepancy per row value
// (missing, extra), recorded once, and repaired by --repair exactly; the next run finds nothing.
func TestKeylessVerifyFindsAndRepairsCopies(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	keylessEvents(t, env)
	startDaemon(t, testConfig(t, env))
	waitSameMultiset(t, env, "events")
	if rep := verifyOnce(t, verifyConfig(t, env, false)); rep.Found != 0 {
		t.Fatalf("equal tables: %+v, want nothing found", rep)
	}
	pgtest.Exec(t, env.Target,
		`delete from events where ctid = (select ctid from events where kind = 'a' and not _cdc_deleted limit 1)`,
		`insert into events select kind, n, doc, at, note, _cdc_row_hash, 424242, _cdc_lsn, _cdc_seq from events where kind = 'b' and not _cdc_deleted limit 1`,
		`update events set n = 77 where ctid = (select ctid from events where kind = 'g5' and not _cdc_deleted limit 1)`)
	// The stream goes on meanwhile, on other values and on one of those edited.
	pgtest.Exec(t, env.Source, `insert into events values ('a', 1, '{"x": 1}', '(1,2)', null)`, `delete from events where kind = 'g9'`)
	narrow := verifyConfig(t, env, false)
	narrow.LeafRows = 64 // narrowed down by value-hash groups before the values are counted
	rep := verifyOnce(t, narrow)
	want := map[string]int64{"missing": 2, "extra": 2} // a (3 → 2), g5's old value; b (2 → 3), g5 with n = 77
	if !reflect.DeepEqual(rep.Tables[0].Found, want) || rep.Tables[0].New != 4 {
		t.Fatalf("found %v (%d new), want %v (4 new)", rep.Tables[0].Found, rep.Tables[0].New, want)
	}
	if r := rep.Tables[0]; r.RangesChecked < 2 || r.RowsFetched > 400 {
		t.Errorf("%d groups checked, %d rows fetched: want the groups narrowed down before counting values", r.RangesChecked, r.RowsFetched)
	}
	if rep = verifyOnce(t, verifyConfig(t, env, false)); rep.Tables[0].New != 0 || rep.Found != 4 {
		t.Fatalf("second run: %d found, %d new; want 4 found again, 0 new", rep.Found, rep.Tables[0].New)
	}
	if rep = verifyOnce(t, verifyConfig(t, env, true)); rep.Repaired != 4 {
		t.Fatalf("repair: %+v, want 4 repaired", rep)
	}
	pgtest.Exec(t, env.Source, `delete from events where ctid = (select ctid from events where kind = 'b' limit 1)`)
	waitSameMultiset(t, env, "events")
	if rep = verifyOnce(t, verifyConfig(t, env, false)); rep.Found != 0 || rep.Open != 0 {
		t.Fatalf("after the repair: %d found, %d open; want none", rep.Found, rep.Open)
	}
}

// A keyless table's columns change while it streams (a column added, one dropped): the row
// hashes follow, so later deletes still find their copies. The table then gains a primary key and
// loses it again: each time the target table is made anew for the new identity and loaded again.
func TestKeylessTableChangesShape(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table k (a int not null, b text, c int)`, `alter table k replica identity full`,
		`insert into k select g, 'x', g % 3 from generate_series(1, 300) g`, `insert into k select g, 'x', g % 3 from generate_series(1, 50) g`)
	startDaemon(t, testConfig(t, env))
	waitSameMultiset(t, env, "k")
	pgtest.WaitStreaming(t, env)
	// A dropped column needs no reload: the deletes that follow find their copies by the new hash.
	pgtest.Exec(t, env.Source, `alter table k drop column c`, `delete from k where ctid = (select ctid from k where a = 7 limit 1)`)
	waitSameMultiset(t, env, "k")
	if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pgconverge.backfills where table_name = 'k'`); n != 1 {
		t.Fatalf("%d backfills of k after a dropped column, want only the initial load", n)
	}
	pgtest.Exec(t, env.Source, `alter table k add column d text`, `delete from k where ctid = (select ctid from k where a = 8 limit 1)`,
		`insert into k values (8, 'x', 'dup'), (8, 'x', 'dup')`, `delete from k where ctid = (select ctid from k where d = 'dup' limit 1)`)
	waitSameMultiset(t, env, "k")
	pgtest.Exec(t, env.Source, `delete from k where a <= 50 and ctid in (select min(ctid) from k where a <= 50 group by a)`,
		`alter table k add primary key (a)`, `update k set b = 'keyed' where a = 60`)
	waitSameMultiset(t, env, "k")
	pgtest.Eventually(t, 60*time.Second, "target k keyed by a", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_index where indrelid = 'k'::regclass and indisprimary and indnatts = 1`)
		return n == 1, fmt.Sprint(n)
	})
	pgtest.Exec(t, env.Source, `alter table k drop constraint k_pkey`, `insert into k values (60, 'keyed', null)`)
	waitSameMultiset(t, env, "k")
	waitCovered(t, env)
}

// A backfill newer than verify's snapshot S that lands before the stream reaches S replaces the
// values' entries, and the stream's changes below it are refused: those values have moved on and
// are not compared, so verify finds nothing where nothing differs.
func TestKeylessVerifyAfterANewerBackfill(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	keylessEvents(t, env)
	d := startDaemon(t, testConfig(t, env))
	waitSameMultiset(t, env, "events")
	waitCovered(t, env)
	d.Stop(t)
	pgtest.Exec(t, env.Source, `insert into events values ('a', 1, '{"x": 1}', '(1,2)', null)`,
		`delete from events where ctid = (select ctid from events where kind = 'b' limit 1)`, `delete from events where kind = 'g4'`)
	type outcome struct {
		rep verify.Report
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		rep, err := verify.Run(context.Background(), verifyConfig(t, env, false))
		done <- outcome{rep, err}
	}()
	// Verify has taken S and waits for the stream; a backfill at S' > S lands first. Its slot is
	// created once verify's is consistent and a record was written after S: two slots created at
	// once on a busy source can reach the same consistent point, and S' would be S.
	pgtest.Eventually(t, 30*time.Second, "verify's snapshot taken (its temporary slot is consistent)", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_replication_slots where temporary and database = current_database() and confirmed_flush_lsn is not null`)
		return n == 1, fmt.Sprint(n)
	})
	pgtest.Exec(t, env.Source, `select pg_logical_emit_message(false, 'pgconverge-test', 'after S')`)
	backfillNow(t, testBackfillConfig(t, env, "public.events"))
	startDaemon(t, testConfig(t, env))
	o := <-done
	if o.err != nil {
		t.Fatalf("verify: %v", o.err)
	}
	if o.rep.Found != 0 || o.rep.Tables[0].MovedOn == 0 {
		t.Errorf("verify after a newer backfill: %d found, %d moved on; want 0 found and the replaced values moved on", o.rep.Found, o.rep.Tables[0].MovedOn)
	}
	waitSameMultiset(t, env, "events")
}

// A keyless table in a publication with a row filter: an UPDATE that moves a row with a TOASTed
// value into the filter arrives as an INSERT, one that moves it out as a DELETE; both converge.
func TestKeylessRowFilter(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.RequireSourceVersion(t, env, 15, "row filters, column lists and schema publications")
	pgtest.Exec(t, env.Source, `create table f (kind text, n int, big text)`, `alter table f replica identity full`,
		`insert into f select 'y', g, (select string_agg(md5((g * h)::text), '') from generate_series(1, 400) h) from generate_series(1, 20) g`,
		`insert into f select 'x', g, 'small' from generate_series(1, 5) g`,
		`create publication `+env.Name+` for table f where (kind = 'x')`)
	startDaemon(t, testConfig(t, env))
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `update f set kind = 'x' where n <= 3 and kind = 'y'`, `update f set kind = 'y' where n = 5 and kind = 'x'`)
	pgtest.Eventually(t, 60*time.Second, "filtered rows on the target", func() (bool, string) {
		want := pgtest.Rows(t, env.Source, `select kind || n || md5(big) from f where kind = 'x' order by 1`)
		got := pgtest.Rows(t, env.Target, `select kind || n || md5(big) from f where not _cdc_deleted order by 1`)
		return multisetDiff(want, got) == "", multisetDiff(want, got)
	})
}
