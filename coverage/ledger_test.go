package coverage

import (
	"context"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage/gaps"
	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/migrations"
)

func ledgerOf(t *testing.T, conn *pgx.Conn, n changebatch.TableName) *TableState {
	t.Helper()
	states, err := ReadTables(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	st := states[n]
	if st == nil {
		t.Fatalf("no ledger for %s", n)
	}
	return st
}

// Segments and spans end where they should: a span at its confirmed position or the slot's
// progress, whichever is lower; an open span at the progress.
func TestSegmentsAndSpans(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	ctx := context.Background()
	db := env.Target
	if err := migrations.Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	a, b := changebatch.TableName{Schema: "public", Name: "a"}, changebatch.TableName{Schema: "public", Name: "b"}
	pgtest.Exec(t, db, `create table a (id int)`, `create table b (id int)`,
		`insert into pgconverge.tables (schema_name, table_name, target_oid) values ('public', 'a', 'a'::regclass), ('public', 'b', 'b'::regclass)`,
		`insert into pgconverge.progress (slot, applied_lsn) values ('s', '0/500')`)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := StartSegment(ctx, db, "s", 0x100, 0x100)
	must(err)
	opened, err := StartSpans(ctx, db, "s", map[changebatch.TableName]SpanStart{a: {LSN: 0x100}, b: {LSN: 0x300}})
	must(err)
	if len(opened) != 2 {
		t.Fatalf("opened %v", opened)
	}
	// Opening again does nothing: each table has its open span.
	opened, err = StartSpans(ctx, db, "s", map[changebatch.TableName]SpanStart{a: {LSN: 0x400}})
	must(err)
	if len(opened) != 0 {
		t.Fatalf("opened %v again", opened)
	}
	must(ConfirmSpans(ctx, db, "s", []changebatch.TableName{a, b}, 0x450))
	// b's membership changed: its span ends at its confirmed position, below the progress.
	pgtest.Exec(t, db, `update pgconverge.progress set applied_lsn = '0/600'`)
	must(EndSpans(ctx, db, "s", []changebatch.TableName{b}, ReasonMembership))
	if got, want := ledgerOf(t, db, b).Ledger.Spans, []gaps.Span{{From: 0x300, To: 0x450}}; !reflect.DeepEqual(got, want) {
		t.Errorf("b's spans %v, want %v", got, want)
	}
	st := ledgerOf(t, db, a)
	if want := []gaps.Span{{From: 0x100, To: 0x600}}; !st.Streaming || st.Slot != "s" || !reflect.DeepEqual(st.Ledger.Spans, want) || st.Ledger.Watermark != 0x600 {
		t.Errorf("a: %+v, want streaming in s with spans %v to the progress", st, want)
	}
	// The slot is lost: at the next start a's membership is confirmed up to now, then the segment
	// and a's span end at the progress; a new segment starts later.
	must(ConfirmSpans(ctx, db, "s", []changebatch.TableName{a}, 0x700))
	ended, err := EndSegment(ctx, db, "s", 0x600, "slot lost")
	must(err)
	if !ended {
		t.Fatal("no open segment ended")
	}
	_, err = StartSegment(ctx, db, "s", 0x900, 0x900)
	must(err)
	pgtest.Exec(t, db, `update pgconverge.progress set applied_lsn = '0/A00'`)
	_, err = StartSpans(ctx, db, "s", map[changebatch.TableName]SpanStart{a: {LSN: 0x900}})
	must(err)
	st = ledgerOf(t, db, a)
	st.Ledger.Chunks = []gaps.Chunk{{S: 0x100}}
	if got, want := gaps.Find(st.Ledger), []gaps.Gap{{From: 0x600, To: 0x900}}; !reflect.DeepEqual(got, want) {
		t.Errorf("a's gaps %v, want %v (spans %v)", got, want, st.Ledger.Spans)
	}
	// Left the selection: not streamed any more.
	left, err := EndSpansExcept(ctx, db, "s", []changebatch.TableName{b}, ReasonDeselected)
	must(err)
	if !reflect.DeepEqual(left, []changebatch.TableName{a}) {
		t.Errorf("ended %v, want a", left)
	}
	if st := ledgerOf(t, db, a); st.Streaming || st.LastEndReason != ReasonDeselected {
		t.Errorf("a after deselection: %+v", st)
	}
}

// An installation from schema version 2 gets an open segment per slot and an open span per loaded
// table from its load, so an upgrade reports no gap and loads nothing again.
func TestUpgradeFromVersion2(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	ctx := context.Background()
	db := env.Target
	if err := migrations.ApplyTo(ctx, db, 2); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db, `create table a (id int)`,
		`insert into pgconverge.progress (slot, applied_lsn, slot_created_lsn) values ('s', '0/900', '0/100')`,
		`insert into pgconverge.tables (schema_name, table_name, loaded_lsn, slot) values ('public', 'a', '0/200', 's')`,
		`insert into pgconverge.backfills (schema_name, table_name, snapshot_lsn, slot, status) values ('public', 'a', '0/200', 's', 'completed')`)
	if err := migrations.Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	st := ledgerOf(t, db, changebatch.TableName{Schema: "public", Name: "a"})
	if want := []gaps.Span{{From: 0x200, To: 0x900}}; !st.Streaming || !reflect.DeepEqual(st.Ledger.Spans, want) || st.Backfilled != 0x200 {
		t.Fatalf("after the upgrade: %+v, want an open span %v and a backfill at 0/200", st, want)
	}
	if gaps := gaps.Find(st.Ledger); gaps != nil {
		t.Errorf("gaps after the upgrade: %v", gaps)
	}
	if s := pgtest.Rows(t, db, `select start_lsn::text || ' ' || slot_created_lsn::text from pgconverge.stream_segments where end_lsn is null`); !reflect.DeepEqual(s, []string{"0/200 0/100"}) {
		t.Errorf("segments %v", s)
	}
}
