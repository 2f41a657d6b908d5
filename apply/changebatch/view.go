package changebatch

import (
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/jackc/pglogrepl"
)

// View reads the rows of a change batch. It borrows the batch: the batch must stay retained while
// the view is used.
type View struct {
	Table     Table
	data      []*array.String
	lsn, seq  *array.Uint64
	op        *array.Uint8
	unchanged *array.List
	names     *array.String
	occ       *array.Uint64 // keyless tables only
}

// NewView checks that rec has the shape of a change batch and returns a reader over it.
func NewView(rec arrow.RecordBatch) (*View, error) {
	t, err := TableOf(rec.Schema())
	if err != nil {
		return nil, err
	}
	v := &View{Table: t}
	n := len(t.Columns)
	for i := 0; i < n; i++ {
		col, ok := rec.Column(i).(*array.String)
		if !ok {
			return nil, fmt.Errorf("change batch of %s: column %q is %s, want utf8", t, t.Columns[i].Name, rec.Column(i).DataType())
		}
		v.data = append(v.data, col)
	}
	var ok1, ok2, ok3, ok4 bool
	v.lsn, ok1 = rec.Column(n).(*array.Uint64)
	v.seq, ok2 = rec.Column(n + 1).(*array.Uint64)
	v.op, ok3 = rec.Column(n + 2).(*array.Uint8)
	v.unchanged, ok4 = rec.Column(n + 3).(*array.List)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return nil, fmt.Errorf("change batch of %s: metadata columns have the wrong types", t)
	}
	if t.Keyless {
		if v.occ, ok1 = rec.Column(n + 4).(*array.Uint64); !ok1 {
			return nil, fmt.Errorf("change batch of keyless table %s: %s is not uint64", t, ColOccurrence)
		}
	}
	v.names, _ = v.unchanged.ListValues().(*array.String)
	return v, nil
}

// Len returns the number of rows.
func (v *View) Len() int { return v.lsn.Len() }

// LSNRange returns the smallest and the largest LSN of the rows' versions; zeros for no rows.
func (v *View) LSNRange() (first, last pglogrepl.LSN) {
	for i, u := range v.lsn.Uint64Values() {
		l := lsnOf(u)
		if i == 0 || l < first {
			first = l
		}
		last = max(last, l)
	}
	return first, last
}

// RowBytes returns the bytes of row i's data column values (their text, NULLs 0).
func (v *View) RowBytes(i int) int {
	n := 0
	for _, d := range v.data {
		if !d.IsNull(i) {
			n += d.ValueLen(i)
		}
	}
	return n
}

// Op returns row i's operation.
func (v *View) Op(i int) Op { return Op(v.op.Value(i)) }

// Version returns row i's version.
func (v *View) Version(i int) Version {
	return Version{LSN: lsnOf(v.lsn.Value(i)), Seq: v.seq.Value(i)}
}

// Value returns column c of row i.
func (v *View) Value(i, c int) Value {
	if v.data[c].IsNull(i) {
		return Value{Null: true}
	}
	return Value{Text: v.data[c].Value(i)}
}

// Unchanged returns the names of the columns of row i that the source did not send, or nil.
func (v *View) Unchanged(i int) []string {
	if v.unchanged.IsNull(i) || v.names == nil {
		return nil
	}
	start, end := v.unchanged.ValueOffsets(i)
	out := make([]string, 0, end-start)
	for j := start; j < end; j++ {
		out = append(out, v.names.Value(int(j)))
	}
	return out
}

// Occurrence returns row i's occurrence (Change.Occurrence); 0 for a table with a key.
func (v *View) Occurrence(i int) uint64 {
	if v.occ == nil {
		return 0
	}
	return v.occ.Value(i)
}

// Change returns row i as a Change, with unchanged columns marked.
func (v *View) Change(i int) Change {
	c := Change{Op: v.Op(i), Version: v.Version(i), Values: make([]Value, len(v.data)), Occurrence: v.Occurrence(i)}
	for col := range v.data {
		c.Values[col] = v.Value(i, col)
	}
	for _, name := range v.Unchanged(i) {
		if col := v.Table.ColumnIndex(name); col >= 0 {
			c.Values[col] = Value{Unchanged: true}
		}
	}
	return c
}
