package staging

import (
	"bytes"
	"context"
	"crypto/md5"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// RowsPrefix is the name prefix of slot's row staging tables in schema pgconverge: stream_rows_,
// then 12 hex digits of the slot name's MD5 (a slot name may take all 63 bytes of a name), then _.
func RowsPrefix(slot string) string {
	return fmt.Sprintf("stream_rows_%x", md5.Sum([]byte(slot)))[:len("stream_rows_")+12] + "_"
}

func (t *Table) rowsPrefix() string { return RowsPrefix(t.slot) }

// leftRowTables returns the slot's row staging tables in the target (quoted, qualified).
func (t *Table) leftRowTables(ctx context.Context) ([]string, error) {
	rows, err := t.conn.Query(ctx, `select format('%I.%I', n.nspname, c.relname) from pg_class c join pg_namespace n on n.oid = c.relnamespace
where n.nspname = 'pgconverge' and c.relkind = 'r' and starts_with(c.relname, $1)`, t.rowsPrefix())
	if err != nil {
		return nil, fmt.Errorf("list the row staging tables of slot %q: %w", t.slot, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list the row staging tables of slot %q: %w", t.slot, err)
	}
	return names, nil
}

// StageRows queues the COPY of rec's changes, made by subtransaction subXid of transaction xid,
// into the transaction's row staging table of rec's table, creating it first
// (apply.StreamedStageSQL); inserts is cdc.Stager's. It keeps a reference to rec until then.
func (t *Table) StageRows(ctx context.Context, xid, subXid uint32, rec arrow.RecordBatch, inserts bool) error {
	rec.Retain()
	err := t.w.queue(ctx, func() error {
		defer rec.Release()
		return t.stageRows(ctx, xid, subXid, rec, inserts)
	})
	if err != nil {
		rec.Release()
	}
	return err
}

func (t *Table) stageRows(ctx context.Context, xid, subXid uint32, rec arrow.RecordBatch, inserts bool) error {
	tab, err := changebatch.TableOf(rec.Schema())
	if err != nil {
		return err
	}
	t.mu.Lock()
	byTable := t.rows[xid]
	if byTable == nil {
		byTable = map[string]*apply.StreamedRows{}
		t.rows[xid] = byTable
	}
	sr := byTable[tab.String()]
	t.mu.Unlock()
	if sr == nil {
		t.next++
		name := pgx.Identifier{"pgconverge", t.rowsPrefix() + strconv.Itoa(t.next)}.Sanitize()
		if _, err := t.conn.Exec(ctx, apply.StreamedStageSQL(tab, name)); err != nil {
			return fmt.Errorf("create the row staging table of %s for transaction %d (slot %q): %w", tab, xid, t.slot, err)
		}
		sr = &apply.StreamedRows{Table: tab, Name: name, Inserts: true}
		t.mu.Lock()
		byTable[tab.String()] = sr
		t.mu.Unlock()
	}
	t.buf.Reset()
	n, err := apply.EncodeStreamedRows(&t.buf, rec, subXid)
	if err != nil {
		return err
	}
	if _, err := t.conn.PgConn().CopyFrom(ctx, bytes.NewReader(t.buf.Bytes()), apply.StreamedCopySQL(tab, sr.Name)); err != nil {
		return fmt.Errorf("copy %d rows of %s into the row staging of transaction %d (slot %q): %w", n, tab, xid, t.slot, err)
	}
	t.mu.Lock()
	sr.Rows += int64(n)
	sr.Inserts = sr.Inserts && inserts
	t.mu.Unlock()
	return nil
}

// StreamedRows returns transaction xid's row staging tables, one per table it staged rows of.
// Safe to call while the loop stages rows of other transactions.
func (t *Table) StreamedRows(xid uint32) []apply.StreamedRows {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []apply.StreamedRows
	for _, sr := range t.rows[xid] {
		out = append(out, *sr)
	}
	slices.SortFunc(out, func(a, b apply.StreamedRows) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// discardRows drops transaction xid's row staging tables.
func (t *Table) discardRows(ctx context.Context, xid uint32) error {
	for _, sr := range t.StreamedRows(xid) {
		if _, err := t.conn.Exec(ctx, "drop table if exists "+sr.Name); err != nil {
			return fmt.Errorf("drop the row staging table %s of transaction %d (slot %q): %w", sr.Name, xid, t.slot, err)
		}
	}
	t.mu.Lock()
	delete(t.rows, xid)
	t.mu.Unlock()
	return nil
}
