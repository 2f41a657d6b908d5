package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// EnsureTable creates the target table for t when it is missing (see createTableSQL) and registers
// it in pgconverge.tables (register); a table it had to create again, or that was replaced by hand,
// is registered as not loaded and in a new generation, so the daemon loads it.
//
// An existing table is brought in line with t, the source table's current description (reshape):
// a column t has and the table lacks is added, nullable and without a default; a column of another
// type is changed to t's type with a cast; a column holding another source column's values than
// t's of its name (dropped and added again, or another renamed onto its name: its attnum is not
// the one recorded) is dropped and added again, empty. Each leaves existing rows without the
// source's values (ADD COLUMN ... DEFAULT and ALTER COLUMN ... TYPE rewrite the source table
// without logical changes), so the table's schema_changed_lsn becomes changedAt, a source
// position read after t was described: backfills read at or before it stop counting as coverage
// and the table is loaded again.
// Target columns t lacks are kept and no longer written. A table made for the other kind of
// identity (a key, or whole rows for a keyless table) is replaced by a new one, in one
// transaction, and loaded again (rebuildForIdentity). It returns what it changed, and an error
// naming the fix when the key differs or a column's values do not convert.
//
// onReload (nil: nothing) is called on conn whenever the table's rows stop counting as loaded: a
// new generation of the target table, or a schema change that needs a reload (RecordSchemaChange).
func EnsureTable(ctx context.Context, conn *pgx.Conn, t changebatch.Table, changedAt pglogrepl.LSN, onReload ReloadFunc) (Reshape, error) {
	var exists bool
	if err := conn.QueryRow(ctx, `select to_regclass($1) is not null`, t.Quoted()).Scan(&exists); err != nil {
		return Reshape{}, fmt.Errorf("look up target table %s: %w", t, err)
	}
	rebuilt := ""
	if exists {
		var err error
		if rebuilt, err = rebuildForIdentity(ctx, conn, t); err != nil {
			return Reshape{}, err
		}
		exists = rebuilt == ""
	}
	if !exists {
		if _, err := conn.Exec(ctx, "create schema if not exists "+pgx.Identifier{t.Schema}.Sanitize()); err != nil {
			return Reshape{}, fmt.Errorf("create target schema %q (the target role needs CREATE on the database): %w", t.Schema, err)
		}
		if err := createTable(ctx, conn, t, rebuilt != ""); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.UndefinedObject || pgErr.Code == pgerrcode.InvalidSchemaName) {
				return Reshape{}, fmt.Errorf("create target table %s: a column's type (or its schema) does not exist on the target: create it there first, as on the source (pgconverge creates user-defined enums, domains and composite types, not other kinds): %w", t, err)
			}
			return Reshape{}, fmt.Errorf("create target table %s (the target role needs CREATE on schema %q): %w", t, t.Schema, err)
		}
	}
	// A table registered for the first time has nothing to reload: it is loaded anyway.
	if err := register(ctx, conn, t, !exists, onReload); err != nil {
		return Reshape{}, err
	}
	r, err := reshape(ctx, conn, t, changedAt, onReload)
	if rebuilt != "" {
		r.Rekeyed = rebuilt
	}
	return r, err
}

// rebuildForIdentity reports whether existing target table t was made for the other kind of
// identity (a key, or whole rows: changebatch.Table.Keyless): the source table gained or lost its
// key. EnsureTable then replaces it (its rows are identified otherwise) and it is loaded again as
// a new generation. It returns the change, "(key) -> (whole row)" or back, or "" when the table
// fits.
func rebuildForIdentity(ctx context.Context, conn *pgx.Conn, t changebatch.Table) (string, error) {
	ours, err := IsTargetTable(ctx, conn, t.TableName)
	if err != nil {
		return "", err
	}
	if !ours {
		return "", NotTargetTableError(t.TableName)
	}
	var keyless bool
	err = conn.QueryRow(ctx, `select exists (select 1 from pg_attribute where attrelid = $1::regclass and attname = $2 and not attisdropped)`,
		t.Quoted(), changebatch.ColRowHash).Scan(&keyless)
	if err != nil {
		return "", fmt.Errorf("read target table %s: %w", t, err)
	}
	if keyless == t.Keyless {
		return "", nil
	}
	var keys []string
	for _, i := range t.KeyOrder() {
		keys = append(keys, t.Columns[i].Name)
	}
	change := "(whole row) -> (" + strings.Join(keys, ", ") + ")"
	if t.Keyless {
		change = "(key) -> (whole row)"
	}
	return change, nil
}

// IsTargetTable reports whether the existing table t on conn is one pgconverge made: it has the
// version columns _cdc_lsn and _cdc_seq. pgconverge changes or replaces no other table: a table of
// the same name that the application made (or one made plain by cutover --finalize) is not its.
func IsTargetTable(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) (bool, error) {
	var n int
	err := conn.QueryRow(ctx, `select count(*) from pg_attribute where attrelid = $1::regclass and attname = any($2) and not attisdropped`,
		t.Quoted(), []string{changebatch.ColLSN, changebatch.ColSeq}).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("read target table %s: %w", t, err)
	}
	return n == 2, nil
}

// NotTargetTableError is the refusal of an existing target table t that pgconverge did not make
// (IsTargetTable), naming the fixes.
func NotTargetTableError(t changebatch.TableName) error {
	return fmt.Errorf("target table %s exists but is not one pgconverge made (it has no _cdc_lsn and _cdc_seq columns: the application's table, or one made plain by cutover --finalize): pgconverge changes no table of yours; replicate into another database, or rename or drop it on the target (DROP TABLE %s CASCADE) and pgconverge creates and loads its own",
		t, t.Quoted())
}

// createTable creates the target table for t (createTableSQL, or keylessTableSQL for a keyless
// table) with its indexes, in one transaction that first drops the existing one when replace is
// set.
func createTable(ctx context.Context, conn *pgx.Conn, t changebatch.Table, replace bool) error {
	stmts := []string{createTableSQL(t)}
	if t.Keyless {
		stmts = keylessTableSQL(t)
	}
	if replace {
		stmts = append([]string{"drop table " + t.Quoted()}, stmts...)
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if replace {
			if err := dropLiveViews(ctx, tx, t); err != nil {
				return err
			}
		}
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
}

// ReloadFunc is told, on the target connection and inside the transaction that records it (when
// there is one), that table t's target rows stopped counting as loaded: its target table began a
// new generation, or a schema change needs a reload. The engine passes coverage.AbandonBackfills,
// so that no unfinished backfill of the table is resumed into rows of another generation or shape;
// apply itself keeps no backfill ledger.
type ReloadFunc func(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) error

// reloaded calls f, when set, for t.
func (f ReloadFunc) reloaded(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) error {
	if f == nil {
		return nil
	}
	return f(ctx, conn, t)
}

// register records t's target table in pgconverge.tables with its oid. A registered table that
// pgconverge just created anew (created), or whose oid changed (someone dropped or replaced it by
// hand), starts a new generation: not loaded, no truncate recorded, onReload told (which abandons
// its unfinished backfills), and what older backfills and streams wrote no longer counts as coverage. A table
// registered without an oid (by an older version) adopts its current one.
func register(ctx context.Context, conn *pgx.Conn, t changebatch.Table, created bool, onReload ReloadFunc) error {
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
  schema_changed_lsn = case when (select renew from r) then null else g.schema_changed_lsn end,
  source_shape = case when (select renew from r) then null else g.source_shape end,
  generation = g.generation + (select renew from r)::int
returning (select renew from r)`, t.Schema, t.Name, t.Quoted(), created).Scan(&renewed)
	if err != nil {
		return fmt.Errorf("register table %s: %w", t, err)
	}
	if renewed {
		return onReload.reloaded(ctx, conn, t.TableName)
	}
	return nil
}

// EnsureType creates type schema.name on the target with ddl (cdc.TypeDefinitions gives it),
// with its schema when missing, unless the type exists. An enum's labels are the source's, in
// sort order: an existing enum is brought in line with them (syncEnum: labels renamed on the
// source renamed alike, missing ones added), and they are recorded. Other existing types are left
// as they are (a value one cannot hold is refused when it arrives). It reports whether it created
// the type and the label changes it made ("old -> new", "+added").
func EnsureType(ctx context.Context, conn *pgx.Conn, schema, name, ddl string, labels []EnumLabel) (bool, []string, error) {
	qualified := pgx.Identifier{schema, name}.Sanitize()
	var exists bool
	if err := conn.QueryRow(ctx, `select to_regtype($1) is not null`, qualified).Scan(&exists); err != nil {
		return false, nil, fmt.Errorf("look up type %s on the target: %w", qualified, err)
	}
	if exists {
		changed, err := syncEnum(ctx, conn, qualified, labels)
		return false, changed, err
	}
	if _, err := conn.Exec(ctx, "create schema if not exists "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return false, nil, fmt.Errorf("create schema %q for type %s on the target (the target role needs CREATE on the database): %w", schema, qualified, err)
	}
	if _, err := conn.Exec(ctx, ddl); err != nil {
		return false, nil, fmt.Errorf("create type %s on the target (%s): %w; create what it needs on the target first (a function or type the source has), or the type itself, as on the source", qualified, ddl, err)
	}
	if labels != nil {
		if err := recordEnum(ctx, conn, qualified, labels); err != nil {
			return true, nil, err
		}
	}
	return true, nil, nil
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
