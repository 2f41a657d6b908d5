package backfill

import (
	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Tombstones returns a change batch of deletes at version (s, 0) for the keys of t (text values in
// t.KeyOrder order) that a read at the snapshot of LSN s did not find (found[i] false), nil when
// there is none: a key re-read at an exact snapshot that has no row there is deleted as of it.
// The caller releases the batch.
func Tombstones(t changebatch.Table, s pglogrepl.LSN, keys [][]string, found []bool) arrow.RecordBatch {
	b := changebatch.NewBuilder(memory.DefaultAllocator, t)
	defer b.Release()
	order := t.KeyOrder()
	for i, k := range keys {
		if found[i] {
			continue
		}
		vals := make([]changebatch.Value, len(t.Columns))
		for j := range vals {
			vals[j] = changebatch.Value{Null: true}
		}
		for j, c := range order {
			vals[c] = changebatch.Value{Text: k[j]}
		}
		b.Append(changebatch.Change{Op: changebatch.OpDelete, Version: changebatch.Version{LSN: s}, Values: vals})
	}
	if b.Rows() == 0 {
		return nil
	}
	return b.NewBatch()
}
