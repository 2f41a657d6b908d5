package apply

import (
	"reflect"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

func v(lsn, seq uint64) changebatch.Version {
	return changebatch.Version{LSN: pglogrepl.LSN(lsn), Seq: seq}
}

func text(s string) changebatch.Value { return changebatch.Value{Text: s} }

var (
	null      = changebatch.Value{Null: true}
	unchanged = changebatch.Value{Unchanged: true}
)

func TestCollapse(t *testing.T) {
	cases := []struct {
		name       string
		in         []changebatch.Change
		want       []stagedRow
		wantMerged int
	}{
		{
			name: "distinct keys keep their order",
			in: []changebatch.Change{
				{Op: changebatch.OpUpsert, Version: v(10, 1), Values: []changebatch.Value{text("2"), text("b"), null}},
				{Op: changebatch.OpUpsert, Version: v(10, 2), Values: []changebatch.Value{text("1"), text("a"), null}},
			},
			want: []stagedRow{
				{op: changebatch.OpUpsert, version: v(10, 1), values: []changebatch.Value{text("2"), text("b"), null}},
				{op: changebatch.OpUpsert, version: v(10, 2), values: []changebatch.Value{text("1"), text("a"), null}},
			},
		},
		{
			name: "latest version wins",
			in: []changebatch.Change{
				{Op: changebatch.OpUpsert, Version: v(10, 1), Values: []changebatch.Value{text("1"), text("a"), text("1.00")}},
				{Op: changebatch.OpUpsert, Version: v(20, 1), Values: []changebatch.Value{text("1"), text("b"), text("2.00")}},
				{Op: changebatch.OpUpsert, Version: v(10, 2), Values: []changebatch.Value{text("1"), text("c"), text("3.00")}},
			},
			want:       []stagedRow{{op: changebatch.OpUpsert, version: v(20, 1), values: []changebatch.Value{text("1"), text("b"), text("2.00")}}},
			wantMerged: 2,
		},
		{
			name: "unchanged TOAST column takes the earlier change's value",
			in: []changebatch.Change{
				{Op: changebatch.OpUpsert, Version: v(10, 1), Values: []changebatch.Value{text("1"), text("big"), text("1.00")}},
				{Op: changebatch.OpUpsert, Version: v(11, 1), Values: []changebatch.Value{text("1"), unchanged, text("2.00")}},
			},
			want:       []stagedRow{{op: changebatch.OpUpsert, version: v(11, 1), values: []changebatch.Value{text("1"), text("big"), text("2.00")}}},
			wantMerged: 1,
		},
		{
			name: "unchanged twice stays unknown",
			in: []changebatch.Change{
				{Op: changebatch.OpUpsert, Version: v(10, 1), Values: []changebatch.Value{text("1"), unchanged, text("1.00")}},
				{Op: changebatch.OpUpsert, Version: v(11, 1), Values: []changebatch.Value{text("1"), unchanged, text("2.00")}},
			},
			want:       []stagedRow{{op: changebatch.OpUpsert, version: v(11, 1), values: []changebatch.Value{text("1"), unchanged, text("2.00")}}},
			wantMerged: 1,
		},
		{
			name: "delete after update is a tombstone",
			in: []changebatch.Change{
				{Op: changebatch.OpUpsert, Version: v(10, 1), Values: []changebatch.Value{text("1"), text("a"), text("1.00")}},
				{Op: changebatch.OpDelete, Version: v(10, 2), Values: []changebatch.Value{text("1"), null, null}},
			},
			want:       []stagedRow{{op: changebatch.OpDelete, version: v(10, 2), values: []changebatch.Value{text("1"), null, null}}},
			wantMerged: 1,
		},
		{
			name: "insert after delete revives the key without old values",
			in: []changebatch.Change{
				{Op: changebatch.OpDelete, Version: v(10, 1), Values: []changebatch.Value{text("1"), null, null}},
				{Op: changebatch.OpUpsert, Version: v(10, 2), Values: []changebatch.Value{text("1"), unchanged, text("5.00")}},
			},
			want:       []stagedRow{{op: changebatch.OpUpsert, version: v(10, 2), values: []changebatch.Value{text("1"), unchanged, text("5.00")}}},
			wantMerged: 1,
		},
		{
			name: "a key change takes unchanged columns from the old key's row in the batch",
			in: []changebatch.Change{
				{Op: changebatch.OpUpsert, Version: v(10, 1), Values: []changebatch.Value{text("1"), text("big 1"), text("1.00")}},
				{Op: changebatch.OpUpsert, Version: v(10, 2), Values: []changebatch.Value{text("2"), text("big 2"), text("2.00")}},
				{Op: changebatch.OpDelete, Version: v(11, 1), Values: []changebatch.Value{text("1"), null, null}},
				{Op: changebatch.OpUpsert, Version: v(11, 1), Values: []changebatch.Value{text("2"), unchanged, text("3.00")}},
			},
			want: []stagedRow{
				{op: changebatch.OpDelete, version: v(11, 1), values: []changebatch.Value{text("1"), null, null}},
				{op: changebatch.OpUpsert, version: v(11, 1), values: []changebatch.Value{text("2"), text("big 1"), text("3.00")}, moved: true, movedAt: v(11, 1)},
			},
			wantMerged: 2,
		},
		{
			name: "a key change whose old row is not in the batch looks it up in the target",
			in: []changebatch.Change{
				{Op: changebatch.OpUpsert, Version: v(10, 2), Values: []changebatch.Value{text("2"), text("big 2"), text("2.00")}},
				{Op: changebatch.OpDelete, Version: v(11, 1), Values: []changebatch.Value{text("1"), null, null}},
				{Op: changebatch.OpUpsert, Version: v(11, 1), Values: []changebatch.Value{text("2"), unchanged, text("3.00")}},
				{Op: changebatch.OpUpsert, Version: v(11, 2), Values: []changebatch.Value{text("2"), unchanged, text("4.00")}},
			},
			want: []stagedRow{
				{op: changebatch.OpUpsert, version: v(11, 2), values: []changebatch.Value{text("2"), unchanged, text("4.00")},
					moved: true, movedAt: v(11, 1), from: []moveSource{{key: []changebatch.Value{text("1"), null, null}, left: v(11, 1)}}},
				{op: changebatch.OpDelete, version: v(11, 1), values: []changebatch.Value{text("1"), null, null}},
			},
			wantMerged: 2,
		},
		{
			name: "keys that differ only by a separator do not collide",
			in: []changebatch.Change{
				{Op: changebatch.OpUpsert, Version: v(10, 1), Values: []changebatch.Value{text("1:"), null, null}},
				{Op: changebatch.OpUpsert, Version: v(10, 2), Values: []changebatch.Value{text("1"), null, null}},
			},
			want: []stagedRow{
				{op: changebatch.OpUpsert, version: v(10, 1), values: []changebatch.Value{text("1:"), null, null}},
				{op: changebatch.OpUpsert, version: v(10, 2), values: []changebatch.Value{text("1"), null, null}},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := changebatch.NewBuilder(memory.NewGoAllocator(), accTable)
			defer b.Release()
			for _, ch := range c.in {
				b.Append(ch)
			}
			rec := b.NewBatch()
			defer rec.Release()
			view, err := changebatch.NewView(rec)
			if err != nil {
				t.Fatal(err)
			}
			got, merged := collapse(view, 0, view.Len())
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("collapse:\n got %+v\nwant %+v", got, c.want)
			}
			if merged != c.wantMerged {
				t.Errorf("merged = %d, want %d", merged, c.wantMerged)
			}
		})
	}
}
