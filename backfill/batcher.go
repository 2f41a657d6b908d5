package backfill

import (
	"context"
	"fmt"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// batcher turns the rows of a snapshot read into change batches of table t at version
// (S, 0): at most rows rows and about MaxBatchBytes bytes each, handed to emit as they fill.
type batcher struct {
	t       changebatch.Table
	b       *changebatch.Builder
	version changebatch.Version
	rows    int
	emit    EmitFunc
}

func newBatcher(t changebatch.Table, snap Snapshot, rows int, emit EmitFunc) *batcher {
	return &batcher{t: t, b: changebatch.NewBuilder(memory.DefaultAllocator, t), version: changebatch.Version{LSN: snap.LSN}, rows: rows, emit: emit}
}

// add appends one row as the server sent it in text form: the table's columns, preceded for a
// keyless table by the row's ctid (keylessQuery), which becomes its occurrence. It emits the
// batch when it is full.
func (w *batcher) add(ctx context.Context, raw [][]byte) error {
	if w.t.Keyless {
		occ, err := parseCTID(raw[0])
		if err != nil {
			return fmt.Errorf("read %s: %w", w.t, err)
		}
		w.b.AppendSnapshotOccurrence(w.version, occ, raw[1:])
	} else {
		w.b.AppendSnapshotRow(w.version, raw)
	}
	if w.b.Rows() >= w.rows || w.b.Bytes() >= MaxBatchBytes {
		return w.flush(ctx)
	}
	return nil
}

// flush emits the rows added since the last batch, if any.
func (w *batcher) flush(ctx context.Context) error {
	if w.b.Rows() == 0 {
		return nil
	}
	rec := w.b.NewBatch()
	defer rec.Release()
	return w.emit(ctx, rec)
}

// release frees the builder.
func (w *batcher) release() { w.b.Release() }
