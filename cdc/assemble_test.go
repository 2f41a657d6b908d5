package cdc

import (
	"fmt"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

var items = changebatch.Table{Schema: "public", Name: "items", Columns: []changebatch.Column{
	{Name: "id", Type: "integer", Key: true}, {Name: "body", Type: "text"}, {Name: "n", Type: "integer"},
}}

var itemsRel = msgRelation(16400, "public", "items", relCol{"id", true}, relCol{"body", false}, relCol{"n", false})

// feed decodes raw pgoutput messages and hands them to a new assembler; it returns the assembler
// and the first error.
func feed(t *testing.T, msgs ...[]byte) (*assembler, error) {
	t.Helper()
	a := newAssembler(memory.NewGoAllocator(), []changebatch.Table{items})
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
			`column "extra" that the replicated table lacks`},
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

func TestRelationWithFewerColumnsMarksTheRestUnknown(t *testing.T) {
	a, err := feed(t, msgBegin(0x10, 1), msgRelation(16400, "public", "items", relCol{"id", true}, relCol{"n", false}),
		msgInsert(16400, "1", "5"), msgCommit(0x10, 0x20))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := render(t, a); got != "public.items U 0/10#1 1 ? 5\n" {
		t.Errorf("rows = %q", got)
	}
}
