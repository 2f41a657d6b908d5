package cdc

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

var items = changebatch.Table{TableName: changebatch.TableName{Schema: "public", Name: "items"}, Columns: []changebatch.Column{
	{Name: "id", Type: "integer", Key: true}, {Name: "body", Type: "text"}, {Name: "n", Type: "integer"},
}}

var itemsRel = msgRelation(16400, "public", "items", relCol{"id", true}, relCol{"body", false}, relCol{"n", false})

// feed decodes raw pgoutput messages and hands them to a new assembler; it returns the assembler
// and the first error.
func feed(t *testing.T, msgs ...[]byte) (*assembler, error) {
	t.Helper()
	return feedAt(t, items, 0, 0, msgs...)
}

// feedAt is feed for table tab described at source position describedAt, with reload fence
// fence.
func feedAt(t *testing.T, tab changebatch.Table, describedAt, fence pglogrepl.LSN, msgs ...[]byte) (*assembler, error) {
	t.Helper()
	a := newAssembler(memory.NewGoAllocator(), []changebatch.Table{tab}, describedAt, map[uint32]pglogrepl.LSN{tab.SourceOID: fence})
	t.Cleanup(a.release)
	for _, raw := range msgs {
		m, err := pglogrepl.Parse(raw)
		if err != nil {
			t.Fatalf("parse %q: %v", raw, err)
		}
		if _, err := a.handle(m); err != nil {
			return a, err
		}
	}
	return a, nil
}

// render prints the taken batches one row a line: op version values (NULL as ∅, unchanged as ?).
func render(t *testing.T, a *assembler) (string, pglogrepl.LSN) {
	t.Helper()
	batches, end := a.take()
	var b strings.Builder
	for _, rec := range batches {
		v, err := changebatch.NewView(rec)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < v.Len(); i++ {
			c := v.Change(i)
			fmt.Fprintf(&b, "%s %c %s", v.Table, c.Op, c.Version)
			for _, val := range c.Values {
				switch {
				case val.Unchanged:
					b.WriteString(" ?")
				case val.Null:
					b.WriteString(" ∅")
				default:
					b.WriteString(" " + val.Text)
				}
			}
			b.WriteByte('\n')
		}
		rec.Release()
	}
	return b.String(), end
}

func TestAssembleTransactions(t *testing.T) {
	cases := []struct {
		name    string
		msgs    [][]byte
		want    string
		wantEnd pglogrepl.LSN
	}{
		{
			name: "insert update delete get commit LSN and ordinals",
			msgs: [][]byte{
				msgBegin(0x500, 7), itemsRel,
				msgInsert(16400, "1", "a", "10"),
				msgUpdate(16400, nil, "1", "b", nil),
				msgDelete(16400, "2", nil, nil),
				msgCommit(0x500, 0x530),
			},
			want: "public.items U 0/500#1 1 a 10\n" +
				"public.items U 0/500#2 1 b ∅\n" +
				"public.items D 0/500#3 2 ∅ ∅\n",
			wantEnd: 0x530,
		},
		{
			name: "key change is a tombstone for the old key and an upsert of the new, at one version",
			msgs: [][]byte{
				msgBegin(0x600, 8), itemsRel,
				msgUpdate(16400, []any{"1", nil, nil}, "9", "a", "10"),
				msgCommit(0x600, 0x640),
			},
			want: "public.items D 0/600#1 1 ∅ ∅\n" +
				"public.items U 0/600#1 9 a 10\n",
			wantEnd: 0x640,
		},
		{
			name: "unchanged TOAST value is marked, not NULL",
			msgs: [][]byte{
				msgBegin(0x700, 9), itemsRel,
				msgUpdate(16400, nil, "1", toast, "11"),
				msgCommit(0x700, 0x720),
			},
			want:    "public.items U 0/700#1 1 ? 11\n",
			wantEnd: 0x720,
		},
		{
			name: "truncate is a fence row; changes of other tables are skipped but counted",
			msgs: [][]byte{
				msgBegin(0x800, 10), itemsRel, msgRelation(16500, "public", "other", relCol{"id", true}),
				msgInsert(16500, "5"),
				msgTruncate(16400, 16500),
				msgInsert(16400, "3", "c", "1"),
				msgCommit(0x800, 0x850),
			},
			want: "public.items T 0/800#2 ∅ ∅ ∅\n" +
				"public.items U 0/800#3 3 c 1\n",
			wantEnd: 0x850,
		},
		{
			name: "two transactions in one group end at the second",
			msgs: [][]byte{
				msgBegin(0x900, 11), itemsRel, msgInsert(16400, "1", "a", "1"), msgCommit(0x900, 0x920),
				msgBegin(0x940, 12), msgInsert(16400, "2", "b", "2"), msgCommit(0x940, 0x960),
			},
			want: "public.items U 0/900#1 1 a 1\n" +
				"public.items U 0/940#1 2 b 2\n",
			wantEnd: 0x960,
		},
		{
			name: "an open transaction taken in part leaves the end at 0",
			msgs: [][]byte{
				msgBegin(0xA00, 13), itemsRel, msgInsert(16400, "1", "a", "1"),
			},
			want:    "public.items U 0/A00#1 1 a 1\n",
			wantEnd: 0,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := feed(t, c.msgs...)
			if err != nil {
				t.Fatal(err)
			}
			got, end := render(t, a)
			if got != c.want {
				t.Errorf("rows:\n%s\nwant:\n%s", got, c.want)
			}
			if end != c.wantEnd {
				t.Errorf("end = %s, want %s", end, c.wantEnd)
			}
		})
	}
}

func TestAssembleRefuses(t *testing.T) {
	cases := []struct {
		name string
		msgs [][]byte
		want string
	}{
		{"column the target lacks", [][]byte{msgBegin(1, 1),
			msgRelation(16400, "public", "items", relCol{"id", true}, relCol{"body", false}, relCol{"n", false}, relCol{"extra", false})},
			`changed its columns (seen at 0/1): added ["extra"]`},
		{"change before relation", [][]byte{msgBegin(1, 1), msgInsert(16400, "1", "a", "1")}, "before its Relation message"},
		{"commit of another transaction", [][]byte{msgBegin(0x10, 1), msgCommit(0x20, 0x30)}, "does not match the open transaction"},
		{"update without its key", [][]byte{msgBegin(1, 1), itemsRel, msgUpdate(16400, nil, toast, "a", "1")}, `did not send key column "id"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := feed(t, c.msgs...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

// typedItems is items described with type oids: n is an integer (23), the others text (25), so a
// Relation message of msgRelation (every column text) shows n with another type.
var typedItems = changebatch.Table{TableName: changebatch.TableName{Schema: "public", Name: "items"}, SourceOID: 16400, Columns: []changebatch.Column{
	{Name: "id", Type: "text", Key: true, TypeOID: 25, TypeMod: -1}, {Name: "body", Type: "text", TypeOID: 25, TypeMod: -1},
	{Name: "n", Type: "integer", TypeOID: 23, TypeMod: -1},
}}

// A Relation message of a transaction committed at or after the description that differs from it
// stops the stream, naming each change.
func TestRelationChangedAfterDescriptionIsASchemaChange(t *testing.T) {
	_, err := feedAt(t, typedItems, 0x10, 0, msgBegin(0x10, 1),
		msgRelation(16400, "public", "items", relCol{"id", true}, relCol{"n", false}, relCol{"note", false}))
	var ch *SchemaChangeError
	if !errors.As(err, &ch) {
		t.Fatalf("err = %v, want a SchemaChangeError", err)
	}
	got := fmt.Sprintf("%s added=%q dropped=%q retyped=%q", ch.LSN, ch.Added, ch.Dropped, ch.Retyped)
	if want := `0/10 added=["note"] dropped=["body"] retyped=["n"]`; got != want {
		t.Errorf("change = %s, want %s", got, want)
	}
}

// A Relation message of a transaction committed before the description, below the table's reload
// fence, is older history a reload overwrites: the columns it lacks are unknown (never NULL), and
// those the description lacks or types otherwise are not written.
func TestRelationBelowTheReloadFenceIsFollowed(t *testing.T) {
	a, err := feedAt(t, typedItems, 0x11, 0x11, msgBegin(0x10, 1),
		msgRelation(16400, "public", "items", relCol{"id", true}, relCol{"gone", false}, relCol{"n", false}),
		msgInsert(16400, "1", "x", "5"), msgCommit(0x10, 0x20))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := render(t, a); got != "public.items U 0/10#1 1 ? ?\n" {
		t.Errorf("rows = %q", got)
	}
}

// Without a reload fence, an older Relation message whose only difference is a column dropped
// since is followed (that column is not written); one whose values cannot all be written asks
// for a reload.
func TestRelationOlderThanDescriptionWithoutFence(t *testing.T) {
	a, err := feedAt(t, items, 0x11, 0, msgBegin(0x10, 1),
		msgRelation(16400, "public", "items", relCol{"id", true}, relCol{"body", false}, relCol{"gone", false}, relCol{"n", false}),
		msgInsert(16400, "1", "b", "x", "5"), msgCommit(0x10, 0x20))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := render(t, a); got != "public.items U 0/10#1 1 b 5\n" {
		t.Errorf("rows = %q", got)
	}
	_, err = feedAt(t, items, 0x11, 0, msgBegin(0x10, 1),
		msgRelation(16400, "public", "items", relCol{"id", true}, relCol{"n", false}))
	var ch *SchemaChangeError
	if !errors.As(err, &ch) || !ch.Reload {
		t.Fatalf("err = %v, want a SchemaChangeError asking for a reload", err)
	}
}

// A Relation message that names other key columns than the description (a primary key redefined,
// another replica identity index) is a key change asking for a reload; below the table's reload
// fence it is older history, whose deletes that carry only the old key are passed over.
func TestRelationWithAnotherKey(t *testing.T) {
	_, err := feedAt(t, items, 0x10, 0, msgBegin(0x10, 1),
		msgRelation(16400, "public", "items", relCol{"id", false}, relCol{"body", true}, relCol{"n", false}))
	var ch *SchemaChangeError
	if !errors.As(err, &ch) || !ch.KeyChanged || !ch.Reload {
		t.Fatalf("err = %v, want a SchemaChangeError with KeyChanged and Reload", err)
	}
	rekeyed := items
	rekeyed.Columns = slices.Clone(items.Columns)
	rekeyed.Columns[0].Key, rekeyed.Columns[0].KeyPos, rekeyed.Columns[1].Key, rekeyed.Columns[1].KeyPos = false, 0, true, 1
	a, err := feedAt(t, rekeyed, 0x11, 0x11, msgBegin(0x10, 1), itemsRel,
		msgDelete(16400, "7", nil, nil), msgInsert(16400, "8", "b", "5"), msgCommit(0x10, 0x20))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := render(t, a); got != "public.items U 0/10#2 8 b 5\n" {
		t.Errorf("rows = %q", got)
	}
}

// Below the reload fence, an update under another replica identity, whose old key tuple lacks
// the description's key, is an upsert of its new row only: no tombstone of an unknown old key.
func TestSupersededUpdateWithAnotherIdentityKeepsItsNewRow(t *testing.T) {
	rel := msgRelation(16400, "public", "items", relCol{"id", false}, relCol{"body", true}, relCol{"n", false})
	a, err := feedAt(t, items, 0x11, 0x11, msgBegin(0x10, 1), rel,
		msgUpdate(16400, []any{nil, "old", nil}, "3", "new", "5"), msgCommit(0x10, 0x20))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := render(t, a); got != "public.items U 0/10#1 3 new 5\n" {
		t.Errorf("rows = %q", got)
	}
}
