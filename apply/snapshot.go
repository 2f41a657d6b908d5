package apply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// ApplySnapshot writes one batch of snapshot rows (a backfill's: every row an upsert at the same
// version (S, 0)) with the version rule, like Apply, and returns what it did and whether the
// direct path met a key the target already holds.
//
// The first snapshot batch of a table in a transaction locks the table's fence row (FOR SHARE), so
// a TRUNCATE fence cannot be raised between this transaction's fence check and its commit: a
// concurrent TRUNCATE waits and then turns the rows written here into tombstones, or it committed
// first and the whole batch is refused. When the fence is at or above (S, 0) nothing is written.
//
// With direct set, the rows are first copied straight into the target table inside a savepoint.
// That is the version rule's own outcome when the target holds none of the keys (no row, a
// version above the fence); if the target holds any of them, the copy fails with a unique
// violation, the savepoint is rolled back and the batch takes the merge path of Apply, and
// conflict is true so the caller can stop trying the direct path.
func (t *Tx) ApplySnapshot(ctx context.Context, rec arrow.RecordBatch, direct bool) (res Result, conflict bool, err error) {
	v, err := changebatch.NewView(rec)
	if err != nil {
		return res, false, err
	}
	if v.Len() == 0 {
		return res, false, nil
	}
	ver := v.Version(0)
	for i := 0; i < v.Len(); i++ {
		if v.Op(i) != changebatch.OpUpsert || v.Version(i) != ver || ver.Seq != 0 || len(v.Unchanged(i)) > 0 {
			return res, false, fmt.Errorf("snapshot batch of %s: row %d is not an upsert at the batch's snapshot version %s", v.Table, i, ver)
		}
	}
	fence, err := t.lockFence(ctx, v.Table)
	if err != nil {
		return res, false, err
	}
	if fence.Compare(ver) >= 0 {
		res.Suppressed = int64(v.Len())
		t.Result.Add(res)
		return res, false, nil
	}
	if direct {
		ok, err := t.copyDirect(ctx, v)
		if err != nil {
			return res, false, err
		}
		if ok {
			res.Applied = int64(v.Len())
			t.Result.Add(res)
			return res, false, nil
		}
		conflict = true
	}
	res, err = t.merge(ctx, v, 0, v.Len())
	if err == nil {
		t.Result.Add(res)
	}
	return res, conflict, err
}

// lockFence returns tab's fence, locking its row in pgconverge.tables until the transaction ends.
func (t *Tx) lockFence(ctx context.Context, tab changebatch.Table) (changebatch.Version, error) {
	key := tab.String()
	if f, ok := t.fences[key]; ok {
		return f, nil
	}
	var lsn string
	var seq int64
	err := t.tx.QueryRow(ctx, `select fence_lsn::text, fence_seq from pgconverge.tables
where schema_name = $1 and table_name = $2 for share`, tab.Schema, tab.Name).Scan(&lsn, &seq)
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

// copyDirect copies v's rows into the target table inside a savepoint and reports false, with the
// savepoint rolled back, when a key already exists there.
func (t *Tx) copyDirect(ctx context.Context, v *changebatch.View) (bool, error) {
	sp, err := t.tx.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("savepoint before copying into %s: %w", v.Table, err)
	}
	t.buf.Reset()
	encodeSnapshotCopy(&t.buf, v)
	sql := "copy " + v.Table.Quoted() + " (" + strings.Join(copyColumns(v.Table), ", ") + ") from stdin"
	_, err = sp.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(t.buf.Bytes()), sql)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		if err := sp.Rollback(ctx); err != nil {
			return false, fmt.Errorf("roll back the direct copy into %s: %w", v.Table, err)
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("copy %d rows into %s: %w", v.Len(), v.Table, err)
	}
	if err := sp.Commit(ctx); err != nil {
		return false, fmt.Errorf("release savepoint after copying into %s: %w", v.Table, err)
	}
	return true, nil
}

// encodeSnapshotCopy writes v's rows in COPY text format for the target table's columns (the data
// columns, then _cdc_lsn, _cdc_seq, _cdc_deleted false, _cdc_unknown NULL).
func encodeSnapshotCopy(buf *bytes.Buffer, v *changebatch.View) {
	n := len(v.Table.Columns)
	for i := 0; i < v.Len(); i++ {
		for c := 0; c < n; c++ {
			val := v.Value(i, c)
			if val.Null {
				buf.WriteString(`\N`)
			} else {
				writeCopyEscaped(buf, val.Text)
			}
			buf.WriteByte('\t')
		}
		ver := v.Version(i)
		buf.WriteString(ver.LSN.String())
		buf.WriteString("\t0\tf\t\\N\n")
	}
}
