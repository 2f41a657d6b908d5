package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// EnsureTable creates the target table for t when it is missing (see createTableSQL) and registers
// it in pgconverge.tables (register); a table it had to create again, or that was replaced by hand,
// is registered as not loaded and in a new generation, so the daemon loads it. When the table
// exists it checks that it has every source column and the metadata columns, and returns an error
// naming what is missing otherwise.
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
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && (pgErr.Code == "42704" || pgErr.Code == "3F000") {
				return fmt.Errorf("create target table %s: a column's type (or its schema) does not exist on the target: create it there first, as on the source (pgconverge does not create user-defined enums, domains or composite types yet): %w", t, err)
			}
			return fmt.Errorf("create target table %s (the target role needs CREATE on schema %q): %w", t, t.Schema, err)
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
	return register(ctx, conn, t, !exists)
}

// register records t's target table in pgconverge.tables with its oid. A registered table that
// pgconverge just created anew (created), or whose oid changed (someone dropped or replaced it by
// hand), starts a new generation: not loaded, no truncate recorded, its unfinished backfills
// abandoned, and what older backfills and streams wrote no longer counts as coverage. A table
// registered without an oid (by an older version) adopts its current one.
func register(ctx context.Context, conn *pgx.Conn, t changebatch.Table, created bool) error {
	var renewed bool
	err := conn.QueryRow(ctx, `with old as (
  select target_oid from pgconverge.tables where schema_name = $1 and table_name = $2 for update),
r as (
  select exists (select 1 from old) and ($4 or coalesce((select target_oid <> $3::regclass::oid from old), false)) as renew)
insert into pgconverge.tables as g (schema_name, table_name, target_oid) values ($1, $2, $3::regclass::oid)
on conflict (schema_name, table_name) do update set target_oid = excluded.target_oid,
  loaded_lsn = case when (select renew from r) then null else g.loaded_lsn end,
  loaded_at = case when (select renew from r) then null else g.loaded_at end,
  slot = case when (select renew from r) then null else g.slot end,
  truncated_lsn = case when (select renew from r) then null else g.truncated_lsn end,
  generation = g.generation + (select renew from r)::int
returning (select renew from r)`, t.Schema, t.Name, t.Quoted(), created).Scan(&renewed)
	if err != nil {
		return fmt.Errorf("register table %s: %w", t, err)
	}
	if renewed {
		return abandonBackfills(ctx, conn, t.Schema, t.Name)
	}
	return nil
}

// EnsureType creates type schema.name on the target with ddl (cdc.TypeDefinitions gives it),
// with its schema when missing, unless the type exists; a type that exists is left as it is (a
// value it cannot hold is refused when it arrives). It reports whether it created the type.
func EnsureType(ctx context.Context, conn *pgx.Conn, schema, name, ddl string) (bool, error) {
	qualified := pgx.Identifier{schema, name}.Sanitize()
	var exists bool
	if err := conn.QueryRow(ctx, `select to_regtype($1) is not null`, qualified).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up type %s on the target: %w", qualified, err)
	}
	if exists {
		return false, nil
	}
	if _, err := conn.Exec(ctx, "create schema if not exists "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return false, fmt.Errorf("create schema %q for type %s on the target (the target role needs CREATE on the database): %w", schema, qualified, err)
	}
	if _, err := conn.Exec(ctx, ddl); err != nil {
		return false, fmt.Errorf("create type %s on the target (%s): %w", qualified, ddl, err)
	}
	return true, nil
}

// HasMetadata reports whether the target has pgconverge's metadata schema (migrations applied by
// run or backfill).
func HasMetadata(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var known bool
	if err := conn.QueryRow(ctx, `select to_regclass('pgconverge.tables') is not null`).Scan(&known); err != nil {
		return false, fmt.Errorf("look up pgconverge.tables on the target: %w", err)
	}
	return known, nil
}

// RegisteredTables returns the tables pgconverge replicates into the target, ordered by name:
// those registered in pgconverge.tables (by run and backfill) whose target table exists. Only
// Schema and Name are set. A target without the pgconverge schema has none and gets an error
// saying so.
func RegisteredTables(ctx context.Context, conn *pgx.Conn) ([]changebatch.Table, error) {
	known, err := HasMetadata(ctx, conn)
	if err != nil {
		return nil, err
	}
	if !known {
		return nil, errors.New("the target has no pgconverge metadata (schema pgconverge): name the tables with --table, or point --target at a database pgconverge replicates into")
	}
	rows, err := conn.Query(ctx, `select schema_name, table_name from pgconverge.tables
where to_regclass(format('%I.%I', schema_name, table_name)) is not null order by 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("list tables in pgconverge.tables: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (changebatch.Table, error) {
		var t changebatch.Table
		err := r.Scan(&t.Schema, &t.Name)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("list tables in pgconverge.tables: %w", err)
	}
	return out, nil
}
