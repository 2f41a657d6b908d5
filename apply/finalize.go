package apply

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Finalize turns target table t into a plain table of the source's rows, in one transaction: its
// live views go (dropLiveViews, and their schema once empty: dropEmptyLiveSchemas), its tombstones (and a keyless table's deleted copies) are
// deleted, its metadata columns (every column named _cdc_…) are dropped, with the key or
// indexes that use them, and it leaves pgconverge.tables, so nothing pgconverge runs touches it
// again. A table finalized already is left as it is; it reports whether it changed t. The source's
// NOT NULL constraints, defaults, indexes and foreign keys are not copied (the target table has
// the key only).
func Finalize(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) (bool, error) {
	changed := false
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `select attname::text from pg_attribute
where attrelid = $1::regclass and attnum > 0 and not attisdropped and starts_with(attname, '_cdc_') order by attnum`, t.Quoted())
		if err != nil {
			return fmt.Errorf("read the columns of target table %s: %w", t, err)
		}
		cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read the columns of target table %s: %w", t, err)
		}
		if len(cols) == 0 {
			return nil
		}
		changed = true
		if err := dropLiveViews(ctx, tx, changebatch.Table{TableName: t}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "delete from "+t.Quoted()+" where "+qDeleted); err != nil {
			return fmt.Errorf("delete the tombstones of %s: %w", t, err)
		}
		drops := ""
		for i, c := range cols {
			if i > 0 {
				drops += ", "
			}
			drops += "drop column " + pgx.Identifier{c}.Sanitize()
		}
		if _, err := tx.Exec(ctx, "alter table "+t.Quoted()+" "+drops); err != nil {
			return fmt.Errorf("drop the metadata columns of %s: %w", t, err)
		}
		if _, err := tx.Exec(ctx, `delete from pgconverge.tables where schema_name = $1 and table_name = $2`, t.Schema, t.Name); err != nil {
			return fmt.Errorf("unregister %s: %w", t, err)
		}
		return dropEmptyLiveSchemas(ctx, tx)
	})
	return changed, err
}
