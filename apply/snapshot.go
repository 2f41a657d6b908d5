package apply

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
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

// lockFence returns tab's fence, locking its row in pgconverge.tables until the transaction ends:
// FOR SHARE, or FOR UPDATE for a keyless table.
func (t *Tx) lockFence(ctx context.Context, tab changebatch.Table) (changebatch.Version, error) {
	key := tab.String()
	if f, ok := t.fences[key]; ok {
		return f, nil
	}
	var lsn string
	var seq int64
	// Writers of a keyless table take turns: each matches deletes with the entries it finds.
	lock := "share"
	if tab.Keyless {
		lock = "update"
	}
	err := t.tx.QueryRow(ctx, `select fence_lsn::text, fence_seq from pgconverge.tables
where schema_name = $1 and table_name = $2 for `+lock, tab.Schema, tab.Name).Scan(&lsn, &seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return changebatch.Version{}, fmt.Errorf("table %s is not registered in pgconverge.tables on the target (apply.EnsureTable registers it)", tab)
	}
	if err != nil {
		return changebatch.Version{}, fmt.Errorf("lock the fence of %s: %w", tab, err)
	}
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return changebatch.Version{}, fmt.Errorf("lock the fence of %s: %w", tab, err)
	}
	f := changebatch.Version{LSN: l, Seq: uint64(seq)}
	t.fences[key] = f
	return f, nil
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
