package apply

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Finalize turns target table t into a plain table of the source's rows, in transaction tx: its
// live views go (dropLiveViews, and their schema once empty: dropEmptyLiveSchemas), its
// tombstones (and a keyless table's deleted copies) are deleted, its metadata columns (every
// column named _cdc_…) are dropped, with the key or indexes that use them, its indexes named
// _cdc_… go (dropTwins), and it leaves pgconverge.tables, so nothing pgconverge runs touches it
// again. A table finalized already is left as it is; it reports whether it changed t. The source's
// other schema objects (NOT NULL, defaults, constraints, indexes, triggers) are the caller's to
// carry over (internal/tableschema), in the same transaction.
func Finalize(ctx context.Context, tx pgx.Tx, t changebatch.TableName) (bool, error) {
	rows, err := tx.Query(ctx, `select attname::text from pg_attribute
where attrelid = $1::regclass and attnum > 0 and not attisdropped and starts_with(attname, '_cdc_') order by attnum`, t.Quoted())
	if err != nil {
		return false, fmt.Errorf("read the columns of target table %s: %w", t, err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return false, fmt.Errorf("read the columns of target table %s: %w", t, err)
	}
	if len(cols) == 0 {
		return false, nil
	}
	if err := dropLiveViews(ctx, tx, changebatch.Table{TableName: t}); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, "delete from "+t.Quoted()+" where "+qDeleted); err != nil {
		return false, fmt.Errorf("delete the tombstones of %s: %w", t, err)
	}
	drops := make([]string, len(cols))
	for i, c := range cols {
		drops[i] = "drop column " + pgx.Identifier{c}.Sanitize()
	}
	if _, err := tx.Exec(ctx, "alter table "+t.Quoted()+" "+strings.Join(drops, ", ")); err != nil {
		return false, fmt.Errorf("drop the metadata columns of %s: %w", t, err)
	}
	if err := dropTwins(ctx, tx, t); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `delete from pgconverge.tables where schema_name = $1 and table_name = $2`, t.Schema, t.Name); err != nil {
		return false, fmt.Errorf("unregister %s: %w", t, err)
	}
	return true, dropEmptyLiveSchemas(ctx, tx)
}

// dropTwins drops table t's indexes named _cdc_… and forgets the indexes built on it
// (pgconverge.target_indexes): the source's own are carried over next, unique where they are.
func dropTwins(ctx context.Context, tx pgx.Tx, t changebatch.TableName) error {
	rows, err := tx.Query(ctx, `select c.relname::text from pg_index i join pg_class c on c.oid = i.indexrelid
where i.indrelid = $1::regclass and starts_with(c.relname, '_cdc_')`, t.Quoted())
	if err != nil {
		return fmt.Errorf("read the indexes of %s: %w", t, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read the indexes of %s: %w", t, err)
	}
	for _, n := range names {
		if _, err := tx.Exec(ctx, "drop index "+pgx.Identifier{t.Schema, n}.Sanitize()); err != nil {
			return fmt.Errorf("drop index %s of %s: %w", n, t, err)
		}
	}
	if _, err := tx.Exec(ctx, `delete from pgconverge.target_indexes where schema_name = $1 and table_name = $2`, t.Schema, t.Name); err != nil {
		return fmt.Errorf("forget the indexes built on %s: %w", t, err)
	}
	return nil
}
