package apply

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// EnsureTable creates the target table for t when it is missing (see createTableSQL) and registers
// it in pgconverge.tables; a table it had to create (again) is registered as not loaded and in a
// new generation (what older backfills and streams wrote is gone), so the daemon loads it. When the table exists it checks that it has every source column and the metadata
// columns, and returns an error naming what is missing otherwise.
func EnsureTable(ctx context.Context, conn *pgx.Conn, t changebatch.Table) error {
	var exists bool
	if err := conn.QueryRow(ctx, `select to_regclass($1) is not null`, t.Quoted()).Scan(&exists); err != nil {
		return fmt.Errorf("look up target table %s: %w", t, err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, "create schema if not exists "+pgx.Identifier{t.Schema}.Sanitize()); err != nil {
			return fmt.Errorf("create target schema %q (the target role needs CREATE on the database): %w", t.Schema, err)
		}
		if _, err := conn.Exec(ctx, createTableSQL(t)); err != nil {
			return fmt.Errorf("create target table %s (the target role needs CREATE on schema %q): %w", t, t.Schema, err)
		}
		_, err := conn.Exec(ctx, `insert into pgconverge.tables (schema_name, table_name) values ($1, $2)
on conflict (schema_name, table_name) do update set loaded_lsn = null, loaded_at = null, slot = null,
  generation = pgconverge.tables.generation + 1, truncated_lsn = null`, t.Schema, t.Name)
		if err != nil {
			return fmt.Errorf("register table %s: %w", t, err)
		}
		if err := abandonBackfills(ctx, conn, t.Schema, t.Name); err != nil {
			return err
		}
	}
	rows, err := conn.Query(ctx, `select attname from pg_attribute
where attrelid = $1::regclass and attnum > 0 and not attisdropped`, t.Quoted())
	if err != nil {
		return fmt.Errorf("read columns of target table %s: %w", t, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read columns of target table %s: %w", t, err)
	}
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	var missing []string
	for _, c := range t.Columns {
		if !have[c.Name] {
			missing = append(missing, c.Name)
		}
	}
	for _, c := range []string{changebatch.ColLSN, changebatch.ColSeq, changebatch.ColDeleted, changebatch.ColUnknown} {
		if !have[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("target table %s exists but lacks columns %s: drop it (DROP TABLE %s on the target) and restart, and pgconverge recreates and reloads it",
			t, strings.Join(missing, ", "), t.Quoted())
	}
	_, err = conn.Exec(ctx, `insert into pgconverge.tables (schema_name, table_name) values ($1, $2)
on conflict do nothing`, t.Schema, t.Name)
	if err != nil {
		return fmt.Errorf("register table %s: %w", t, err)
	}
	return nil
}
