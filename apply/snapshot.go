package apply

import (
	"bytes"
	"context"
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// ApplySnapshot writes one batch of snapshot rows (a backfill's: every row an upsert at the same
// version (S, 0)) with the version rule through the merge of Apply. When the table's fence is at
// or above (S, 0) nothing is written and every row counts as suppressed.
func (t *Tx) ApplySnapshot(ctx context.Context, rec arrow.RecordBatch) (Result, error) {
	var res Result
	v, err := changebatch.NewView(rec)
	if err != nil || v.Len() == 0 {
		return res, err
	}
	ver, err := snapshotVersion(v)
	if err != nil {
		return res, err
	}
	fence, err := t.lockFence(ctx, v.Table)
	if err != nil {
		return res, err
	}
	switch {
	case fence.Compare(ver) >= 0:
		res.Suppressed = int64(v.Len())
	case v.Table.Keyless:
		if res, err = t.mergeKeylessSnapshot(ctx, v, ver); err != nil {
			return res, err
		}
	default:
		if res, err = t.merge(ctx, v, 0, v.Len()); err != nil {
			return res, err
		}
	}
	t.Result.Add(res)
	return res, nil
}

// snapshotVersion returns the version of v's rows, or an error when they are not all upserts of
// one snapshot version (S, 0) with every column known.
func snapshotVersion(v *changebatch.View) (changebatch.Version, error) {
	ver := v.Version(0)
	for i := 0; i < v.Len(); i++ {
		if v.Op(i) != changebatch.OpUpsert || v.Version(i) != ver || ver.Seq != 0 || len(v.Unchanged(i)) > 0 {
			return ver, fmt.Errorf("snapshot batch of %s: row %d is not an upsert at the batch's snapshot version %s", v.Table, i, ver)
		}
	}
	return ver, nil
}

// writeCopyValues writes row i of v's data columns in COPY text format, each followed by a tab.
func writeCopyValues(buf *bytes.Buffer, v *changebatch.View, i int) {
	for c := range v.Table.Columns {
		val := v.Value(i, c)
		if val.Null {
			buf.WriteString(`\N`)
		} else {
			writeCopyEscaped(buf, val.Text)
		}
		buf.WriteByte('\t')
	}
}
