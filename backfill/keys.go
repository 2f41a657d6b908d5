package backfill

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// BeginSnapshot starts a REPEATABLE READ, READ ONLY transaction on conn that imports snap, and
// checks (locking them against rewrites for the rest of the transaction) that tables were not
// rewritten since snap (ErrRewritten): what a reader other than ReadChunk needs, for example
// verify's checksums.
func BeginSnapshot(ctx context.Context, conn *pgx.Conn, snap Snapshot, tables ...changebatch.Table) (pgx.Tx, error) {
	tx, err := beginSnapshot(ctx, conn, snap)
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		if err := checkNotRewritten(ctx, tx, t, snap); err != nil {
			tx.Rollback(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return tx, nil
}

// ReadKeys reads the rows of table t with the given keys (keys[i] holds one key's values as text,
// in t.KeyOrder) that snapshot snap shows, over conn (a source connection not in a transaction),
// matched by the key types' own equality, and emits them as upsert batches at version (snap.LSN,
// 0), as ReadChunk does. It returns, for each key, whether the snapshot has a row for it.
func ReadKeys(ctx context.Context, conn *pgx.Conn, snap Snapshot, t changebatch.Table, keys [][]string, emit EmitFunc) ([]bool, error) {
	found := make([]bool, len(keys))
	if len(keys) == 0 {
		return found, nil
	}
	tx, err := BeginSnapshot(ctx, conn, snap, t)
	if err != nil {
		return nil, fmt.Errorf("read keys of %s: %w", t, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	join, joinArgs, err := KeyJoin(t, keys)
	if err != nil {
		return nil, fmt.Errorf("read keys of %s: %w", t, err)
	}
	args := append([]any{pgx.QueryResultFormats{pgx.TextFormatCode}}, joinArgs...)
	sel := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		sel[i] = "s." + pgx.Identifier{c.Name}.Sanitize()
	}
	q := "select u.ord, " + strings.Join(sel, ", ") + " from " + t.SourceRelation("s") + " " + join
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("read keys of %s at snapshot %s: %w", t, snap.LSN, err)
	}
	defer rows.Close()
	w := newBatcher(t, snap, 1000, emit)
	defer w.release()
	for rows.Next() {
		raw := rows.RawValues()
		ord, err := strconv.Atoi(string(raw[0]))
		if err != nil || ord < 1 || ord > len(keys) {
			return nil, fmt.Errorf("read keys of %s: ordinal %q", t, raw[0])
		}
		found[ord-1] = true
		if err := w.add(ctx, raw[1:]); err != nil {
			return nil, err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read keys of %s at snapshot %s: %w", t, snap.LSN, err)
	}
	if err := w.flush(ctx); err != nil {
		return nil, err
	}
	return found, nil
}

// KeyJoin returns the SQL that joins a relation aliased s (table t) with the given keys (keys[i]
// holds one key's values as text, in t.KeyOrder), matching by the key types' own equality and
// collations: "join unnest($1::text[], …) with ordinality as u(k0, …, ord) on s.… = u.k0::type
// and …", where u.ord is a key's 1-based position in keys; and its arguments, one text array per
// key column, numbered from $1. It returns an error when a key has not one value per key column.
func KeyJoin(t changebatch.Table, keys [][]string) (string, []any, error) {
	order := t.KeyOrder()
	cols := make([][]string, len(order))
	for _, k := range keys {
		if len(k) != len(order) {
			return "", nil, fmt.Errorf("a key of %s has %d values, its key %d columns", t, len(k), len(order))
		}
		for j := range order {
			cols[j] = append(cols[j], k[j])
		}
	}
	var params, names, on []string
	args := make([]any, len(order))
	for j, i := range order {
		c := t.Columns[i]
		u := "k" + strconv.Itoa(j)
		params = append(params, "$"+strconv.Itoa(j+1)+"::text[]")
		names = append(names, u)
		on = append(on, "s."+pgx.Identifier{c.Name}.Sanitize()+" = u."+u+"::"+c.Type)
		args[j] = cols[j]
	}
	return "join unnest(" + strings.Join(params, ", ") + ") with ordinality as u(" + strings.Join(names, ", ") + ", ord) on " +
		strings.Join(on, " and "), args, nil
}
