package apply_test

import (
	"context"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// applySnapshot applies rec with Tx.ApplySnapshot in its own transaction.
func (f fixture) applySnapshot(t *testing.T, rec arrow.RecordBatch) (res apply.Result) {
	t.Helper()
	f.inTx(t, func(ctx context.Context, tx *apply.Tx) (bool, error) {
		var err error
		res, err = tx.ApplySnapshot(ctx, rec)
		return true, err
	})
	return res
}

// copySnapshot copies lines (COPY text rows of acc's columns, as a source's COPY TO prints them)
// at snapshot version (lsn, 0) with Tx.CopySnapshotRows in one transaction, committed unless the
// target held a key; it fails the test unless every line was read.
func (f fixture) copySnapshot(t *testing.T, lsn uint64, lines ...string) (res apply.Result, conflict bool) {
	t.Helper()
	f.inTx(t, func(ctx context.Context, tx *apply.Tx) (bool, error) {
		var n int64
		var err error
		res, n, conflict, err = tx.CopySnapshotRows(ctx, acc, changebatch.Version{LSN: pglogrepl.LSN(lsn)}, 0, func(w io.Writer, binary bool) (int64, error) {
			if binary {
				return 0, errors.New("binary rows asked for without the source's version")
			}
			for _, l := range lines {
				// Written in two parts, as a source's COPY output may arrive split anywhere.
				if _, err := io.WriteString(w, l[:len(l)/2]); err != nil {
					return 0, err
				}
				if _, err := io.WriteString(w, l[len(l)/2:]+"\n"); err != nil {
					return 0, err
				}
			}
			return int64(len(lines)), nil
		})
		if err == nil && n != int64(len(lines)) {
			t.Errorf("copy read %d of %d rows", n, len(lines))
		}
		return !conflict, err
	})
	return res, conflict
}

// The stream updated a row the target did not hold and left its TOASTed note unchanged, so the
// note is unknown. A later backfill row for that key, older than the stream's change, fills the
// note and nothing else: the balance keeps the stream's newer value, and the version stays the
// stream's.
func TestSnapshotRowFillsUnknownColumnsOnly(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.apply(t, batch(t, row{changebatch.OpUpsert, 500, 1, "1", nil, "99"}))
	f.expect(t, "1||99|0/1F4#1|f|{note}")
	if got := f.applySnapshot(t, batch(t, row{changebatch.OpUpsert, 400, 0, "1", s("the big note"), "5"})); got.Applied != 1 {
		t.Fatalf("backfill row = %+v, want applied (filled)", got)
	}
	f.expect(t, "1|the big note|99|0/1F4#1|f|")
	// Once known, an older snapshot row changes nothing.
	if got := f.applySnapshot(t, batch(t, row{changebatch.OpUpsert, 450, 0, "1", s("other"), "6"})); got.Suppressed != 1 {
		t.Fatalf("second backfill row = %+v, want suppressed", got)
	}
	// An older streamed change never fills: only a snapshot row holds the whole row.
	f.apply(t, batch(t, row{changebatch.OpUpsert, 600, 1, "2", nil, "7"}))
	if got := f.apply(t, batch(t, row{changebatch.OpUpsert, 550, 1, "2", s("stale"), "1"})); got.Suppressed != 1 {
		t.Fatalf("older streamed change = %+v, want suppressed", got)
	}
	f.expect(t, "1|the big note|99|0/1F4#1|f|", "2||7|0/258#1|f|{note}")
}

// The direct COPY writes rows the target does not hold at their snapshot version, the source's
// escapes passed through; when the target holds one of the keys it reports a conflict and writes
// nothing, having read every row.
func TestCopySnapshotRows(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, conflict := f.copySnapshot(t, 400, `1	tab\there	1`, `2	back\\slash	2`, `3	line\nbreak	3`, `4	\N	4`)
	if conflict || !reflect.DeepEqual(res, apply.Result{Applied: 4}) {
		t.Fatalf("copy = %+v conflict %v, want 4 applied", res, conflict)
	}
	want := []string{"1|tab\there|1|0/190#0|f|", "2|back\\slash|2|0/190#0|f|", "3|line\nbreak|3|0/190#0|f|", "4||4|0/190#0|f|"}
	f.expect(t, want...)
	if _, conflict := f.copySnapshot(t, 500, "5	new	5", "2	held	9", "6	after	6"); !conflict {
		t.Fatal("copy of a held key: no conflict reported")
	}
	f.expect(t, want...)
}

// Snapshot rows at or below the table's fence are suppressed by both paths.
func TestSnapshotRowsBelowTheFence(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.apply(t, batch(t, row{changebatch.OpTruncate, 700, 1, "", nil, ""}))
	if res, conflict := f.copySnapshot(t, 600, "1	x	1"); conflict || !reflect.DeepEqual(res, apply.Result{Suppressed: 1}) {
		t.Fatalf("copy below the fence = %+v conflict %v, want 1 suppressed", res, conflict)
	}
	if res := f.applySnapshot(t, batch(t, row{changebatch.OpUpsert, 600, 0, "1", s("x"), "1"})); !reflect.DeepEqual(res, apply.Result{Suppressed: 1}) {
		t.Fatalf("merge below the fence = %+v, want 1 suppressed", res)
	}
	f.expect(t)
}
