package apply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// CopySnapshot writes the snapshot rows of batches (each batch as ApplySnapshot takes them, all
// of table tab) with one COPY straight into the target table, encoding a batch while the server
// stores the previous one. That is the version rule's own outcome when the target holds none of
// the keys (no row; a version above the fence, checked first). When it holds one, the COPY fails
// with a unique violation and CopySnapshot returns conflict true: the transaction is then
// unusable, and the caller rolls it back and applies the rows with ApplySnapshot instead. It
// releases every batch it receives; it reads batches until the channel closes or it fails, and
// then the caller must stop the producer.
//
// Like ApplySnapshot it first locks the table's fence row (FOR SHARE) for the rest of the
// transaction, so a TRUNCATE fence cannot be raised between the check and the commit.
func (t *Tx) CopySnapshot(ctx context.Context, tab changebatch.Table, batches <-chan arrow.RecordBatch) (res Result, conflict bool, err error) {
	if tab.Keyless {
		return res, true, nil // its rows are always merged (ApplySnapshot)
	}
	fence, err := t.lockFence(ctx, tab)
	if err != nil {
		return res, false, err
	}
	pr, pw := io.Pipe()
	var rows int64
	encoded := make(chan error, 1)
	go func() {
		var buf bytes.Buffer
		var err error
		for rec := range batches {
			err = encodeSnapshotBatch(&buf, rec, tab, fence, &res)
			if err == nil && buf.Len() > 0 {
				_, err = pw.Write(buf.Bytes())
			}
			rows += rec.NumRows()
			rec.Release()
			if err != nil {
				break
			}
		}
		pw.CloseWithError(err)
		encoded <- err
	}()
	sql := "copy " + tab.Quoted() + " (" + strings.Join(copyColumns(tab), ", ") + ") from stdin"
	tag, err := t.tx.Conn().PgConn().CopyFrom(ctx, pr, sql)
	pr.CloseWithError(errCopyEnded) // unblocks the encoder if the COPY ended early
	encErr := <-encoded
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation:
		return res, true, nil
	case err != nil && encErr != nil:
		return res, false, encErr
	case err != nil:
		return res, false, fmt.Errorf("copy %d rows into %s: %w", rows, tab, withCopyContext(err))
	}
	res.Applied = tag.RowsAffected()
	t.Result.Add(res)
	return res, false, nil
}

// errCopyEnded stops CopySnapshot's encoder once the COPY has ended.
var errCopyEnded = errors.New("copy ended")

// encodeSnapshotBatch checks that rec holds snapshot rows of tab and writes them into buf (reset
// first) for COPY, or counts them in res as suppressed when fence is at or above their version.
func encodeSnapshotBatch(buf *bytes.Buffer, rec arrow.RecordBatch, tab changebatch.Table, fence changebatch.Version, res *Result) error {
	buf.Reset()
	v, err := changebatch.NewView(rec)
	if err != nil || v.Len() == 0 {
		return err
	}
	if v.Table.String() != tab.String() {
		return fmt.Errorf("snapshot batch of %s in a copy into %s", v.Table, tab)
	}
	ver, err := snapshotVersion(v)
	if err != nil {
		return err
	}
	if fence.Compare(ver) >= 0 {
		res.Suppressed += int64(v.Len())
		return nil
	}
	encodeSnapshotCopy(buf, v)
	return nil
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

// encodeSnapshotCopy writes v's rows in COPY text format for the target table's columns (the data
// columns, then _cdc_lsn, _cdc_seq, _cdc_deleted false, _cdc_unknown NULL).
func encodeSnapshotCopy(buf *bytes.Buffer, v *changebatch.View) {
	meta := "\t0\tf\t\\N\n"
	if v.Len() > 0 {
		meta = v.Version(0).LSN.String() + meta // one version per snapshot batch (snapshotVersion)
	}
	for i := 0; i < v.Len(); i++ {
		writeCopyValues(buf, v, i)
		buf.WriteString(meta)
	}
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
