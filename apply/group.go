package apply

import (
	"context"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// ApplyGroup applies a stream group: recs, batches of one or more tables in the order the stream
// committed them, and the progress p (when p.Slot is set), with Apply's outcome for each batch,
// whose results it returns in recs' order. It pipelines (PostgreSQL docs §55.2.4 "Pipelining"):
// the fence locks, the progress and the merge of every leading batch that takes one statement
// (oneStatement) go to the target in one round trip; the batches from the first that does not
// are applied one by one after them (Apply), so a table's batches keep their order. A group of
// small source transactions is then BEGIN, one round trip and COMMIT.
func (t *Tx) ApplyGroup(ctx context.Context, recs []arrow.RecordBatch, p Progress) ([]Result, error) {
	results := make([]Result, len(recs))
	tabs := make([]changebatch.Table, 0, len(recs))
	for _, rec := range recs {
		tab, err := changebatch.TableOf(rec.Schema())
		if err != nil {
			return nil, err
		}
		tabs = append(tabs, tab)
	}
	b := &pgx.Batch{}
	readStart := t.queueStart(b, tabs, p)
	type queued struct {
		tab    changebatch.Table
		rows   int
		merged int
		src    source
	}
	var pipelined []queued
	for _, rec := range recs {
		v, err := changebatch.NewView(rec)
		if err != nil {
			return nil, err
		}
		rows, merged, records := oneStatement(t.copyOnly(), v)
		if records == nil {
			break
		}
		src := source{records: records}
		if src.stage, err = t.ensureStage(ctx, v.Table); err != nil {
			return nil, err
		}
		sql, args := upsertSQL(v.Table, src, false)
		b.Queue(sql, args...)
		pipelined = append(pipelined, queued{tab: v.Table, rows: len(rows), merged: merged, src: src})
	}
	if b.Len() > 0 {
		br := t.tx.SendBatch(ctx, b)
		if err := readStart(br); err != nil {
			br.Close()
			return nil, err
		}
		for i, q := range pipelined {
			tag, err := br.Exec()
			if err != nil {
				br.Close()
				return nil, upsertError(t.copyOnly(), q.tab, q.rows, q.src, err)
			}
			applied := tag.RowsAffected()
			results[i] = Result{Applied: applied, Suppressed: int64(q.rows) - applied, Merged: int64(q.merged)}
			t.Result.Add(results[i])
		}
		if err := br.Close(); err != nil {
			return nil, err
		}
	}
	for i := len(pipelined); i < len(recs); i++ {
		var err error
		if results[i], err = t.Apply(ctx, recs[i]); err != nil {
			return nil, err
		}
	}
	return results, nil
}

// oneStatement returns v's rows collapsed (collapse) with the changes merged away, and their
// inline records, when merging v takes exactly the one upsert a pipeline can carry: v has a key,
// no TRUNCATE, fits one inline piece, and no row left a column unchanged (such rows take lookups
// before the upsert or a read of the keys left unknown after it). Otherwise records is nil.
func oneStatement(copyOnly copyOnlyIn, v *changebatch.View) (rows []stagedRow, merged int, records []string) {
	if v.Table.Keyless || v.Len() == 0 || v.Len() > inlineRows {
		return nil, 0, nil
	}
	for i := 0; i < v.Len(); i++ {
		if v.Op(i) == changebatch.OpTruncate {
			return nil, 0, nil
		}
	}
	rows, merged = collapse(v, 0, v.Len())
	for _, r := range rows {
		if r.from != nil || anyUnchanged(r.values) {
			return nil, 0, nil
		}
	}
	return rows, merged, inlineRecords(copyOnly, v.Table, rows)
}
