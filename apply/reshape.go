package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Reshape is what EnsureTable changed in an existing target table to match the source table's
// description.
type Reshape struct {
	// Added are the columns it added (nullable, no default); Retyped describe the columns it
	// changed to the source's new type, as "name: old type -> new type".
	Added, Retyped []string
	// Replaced are the target columns it dropped and added again empty, with the source's type:
	// the source column of that name is another column than the one whose values they hold
	// (sourceShape.replaces: dropped and added again, or another renamed onto the name).
	Replaced []string
	// Rewritten says why the source table's rows may hold values no change delivered although
	// the columns look alike (sourceShape.changes): a rewrite, a column dropped and added again.
	Rewritten []string
	// Kept are target columns the source table no longer has (dropped, or renamed there): they
	// stay, with the values they had, and nothing writes them any more.
	Kept []string
	// Generated are the generated columns it added or created again with the source's type and
	// expression; Plain are generated columns the source made plain (DROP EXPRESSION), or that it
	// dropped (kept), made plain too.
	Generated, Plain []string
	// Rekeyed describes a primary key changed to the source's new key, "(old) -> (new)": the
	// tombstones, which carry only the old key, are removed (and the live rows too when they do
	// not fit the new key), and the table is loaded again under the new key.
	Rekeyed string
}

// Reloads reports whether the change leaves existing rows without the source's values, so that
// the table must be loaded again.
func (r Reshape) Reloads() bool {
	return len(r.Added)+len(r.Retyped)+len(r.Replaced)+len(r.Rewritten) > 0 || r.Rekeyed != ""
}

// targetColumn is a data column of a target table: its type as format_type prints it with
// schema-qualified names, and whether it is in the primary key.
type targetColumn struct {
	name, typ string
	// base is the base type of a column whose type is a domain, "" for others.
	base string
	key  bool
	// expr is the generation expression of a generated column, "" for others.
	expr string
}

// readTargetColumns returns the data columns of target table t (without pgconverge's metadata
// columns) in attribute order, and the names of all its columns.
func readTargetColumns(ctx context.Context, conn *pgx.Conn, t changebatch.Table) ([]targetColumn, map[string]bool, error) {
	var cols []targetColumn
	all := map[string]bool{}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `set local search_path to pg_catalog`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `select a.attname, format_type(a.atttypid, a.atttypmod), coalesce(format_type(dt.typbasetype, dt.typtypmod), ''),
  coalesce(a.attnum = any (i.indkey::int2[]), false), coalesce(case when a.attgenerated <> '' then pg_get_expr(d.adbin, d.adrelid) end, '')
from pg_attribute a left join pg_index i on i.indrelid = a.attrelid and i.indisprimary
left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
left join pg_type dt on dt.oid = a.atttypid and dt.typtype = 'd'
where a.attrelid = $1::regclass and a.attnum > 0 and not a.attisdropped order by a.attnum`, t.Quoted())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c targetColumn
			if err := rows.Scan(&c.name, &c.typ, &c.base, &c.key, &c.expr); err != nil {
				return err
			}
			all[c.name] = true
			if !changebatch.IsReserved(c.name) {
				cols = append(cols, c)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read columns of target table %s: %w", t, err)
	}
	return cols, all, nil
}

// reshape brings existing target table t in line with the source's description in one target
// transaction (see EnsureTable), generated columns included, and records the source table's shape
// (sourceShape); changedAt is recorded as the table's schema_changed_lsn when rows must be loaded
// again. It returns an error naming the fix when the metadata columns are missing, the key
// differs, or the target refuses a change.
func reshape(ctx context.Context, conn *pgx.Conn, t changebatch.Table, changedAt pglogrepl.LSN, onReload ReloadFunc) (Reshape, error) {
	var r Reshape
	cols, all, err := readTargetColumns(ctx, conn, t)
	if err != nil {
		return r, err
	}
	if err := checkMetadataColumns(t, all); err != nil {
		return r, err
	}
	if missingKey(t, cols) {
		// An interrupted bulk load deferred the key (bulkkey.go): build it, nothing changed.
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { _, err := RestoreKey(ctx, tx, t); return err }); err != nil {
			return r, err
		}
		if cols, _, err = readTargetColumns(ctx, conn, t); err != nil {
			return r, err
		}
	}
	old, err := readShape(ctx, conn, t)
	if err != nil {
		return r, err
	}
	ddl := r.plan(t, cols, old)
	oldKey, newKey := keyChange(t, cols, r.Replaced)
	if oldKey != nil {
		r.Rekeyed = fmt.Sprintf("(%s) -> (%s)", strings.Join(oldKey, ", "), strings.Join(newKey, ", "))
	}
	cur := shapeOf(t)
	r.Rewritten = old.changes(cur)
	if len(ddl) == 0 && !r.Reloads() && old.equal(cur) {
		return r, nil
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if len(ddl) > 0 || oldKey != nil {
			if err := dropLiveViews(ctx, tx, t); err != nil {
				return err
			}
		}
		if oldKey != nil {
			if err := dropKey(ctx, tx, t, oldKey, newKey); err != nil {
				return err
			}
		}
		for _, stmt := range ddl {
			if _, err := tx.Exec(ctx, "alter table "+t.Quoted()+" "+stmt); err != nil {
				return fmt.Errorf("%s: %w", stmt, err)
			}
		}
		if oldKey != nil {
			if err := addKey(ctx, tx, t); err != nil {
				return err
			}
		}
		if t.Keyless {
			// The row hash covers the source's columns: entries must match the changes that
			// follow, whatever column came or went.
			if _, err := tx.Exec(ctx, rehashSQL(t)); err != nil {
				return fmt.Errorf("compute the row hashes of %s again: %w", t, err)
			}
		}
		if err := writeShape(ctx, tx.Conn(), t, cur); err != nil {
			return err
		}
		if !r.Reloads() {
			return nil
		}
		return RecordSchemaChange(ctx, tx.Conn(), t.TableName, changedAt, onReload)
	})
	if err == nil {
		return r, nil
	}
	// Once someone fixes the target table by hand, the table must still be loaded again.
	if r.Reloads() {
		if rerr := RecordSchemaChange(ctx, conn, t.TableName, changedAt, onReload); rerr != nil {
			return r, rerr
		}
	}
	return r, reshapeError(t, r, err)
}

// checkMetadataColumns returns an error naming the fix when the target table lacks pgconverge's
// metadata columns (all names its columns).
func checkMetadataColumns(t changebatch.Table, all map[string]bool) error {
	var missing []string
	want := []string{changebatch.ColLSN, changebatch.ColSeq, changebatch.ColDeleted, changebatch.ColUnknown}
	if t.Keyless {
		want = append(want, keylessColumns...)
	}
	for _, c := range want {
		if !all[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("target table %s exists but lacks pgconverge's columns %s: drop it (DROP TABLE %s CASCADE on the target: CASCADE drops its live view too, and any view of yours over it) and restart, and pgconverge recreates and reloads it",
			t, strings.Join(missing, ", "), t.Quoted())
	}
	return nil
}

// missingKey reports whether keyed table t's target table has no primary key at all (cols as
// readTargetColumns reads them): a bulk load deferred it (DeferKey).
func missingKey(t changebatch.Table, cols []targetColumn) bool {
	if t.Keyless {
		return false
	}
	for _, c := range cols {
		if c.key {
			return false
		}
	}
	return true
}

// keyChange returns the target table's primary key columns and the source's key columns (both
// sorted) when they differ or when a column of the target's key is among the replaced ones (its
// drop takes the primary key with it), nil and nil otherwise.
func keyChange(t changebatch.Table, cols []targetColumn, replaced []string) (oldKey, newKey []string) {
	for _, i := range t.KeyIndexes() {
		newKey = append(newKey, t.Columns[i].Name)
	}
	for _, c := range cols {
		if c.key {
			oldKey = append(oldKey, c.name)
		}
	}
	slices.Sort(newKey)
	slices.Sort(oldKey)
	if slices.Equal(oldKey, newKey) && !slices.ContainsFunc(oldKey, func(c string) bool { return slices.Contains(replaced, c) }) {
		return nil, nil
	}
	return oldKey, newKey
}

// dropKey removes target table t's primary key on oldKey, inside tx, for the source's newKey:
// its tombstones go (they carry only the old key, and the reload under the new key that follows
// fences every older version anyway), and the old key's columns become nullable, as non-key
// columns are.
func dropKey(ctx context.Context, tx pgx.Tx, t changebatch.Table, oldKey, newKey []string) error {
	if _, err := tx.Exec(ctx, "delete from "+t.Quoted()+" where "+pgx.Identifier{changebatch.ColDeleted}.Sanitize()); err != nil {
		return fmt.Errorf("remove the tombstones of %s before its key changes: %w", t, err)
	}
	var pk string
	err := tx.QueryRow(ctx, `select conname::text from pg_constraint where conrelid = $1::regclass and contype = 'p'`, t.Quoted()).Scan(&pk)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("look up the primary key of target table %s: %w", t, err)
	}
	if pk != "" {
		if _, err := tx.Exec(ctx, "alter table "+t.Quoted()+" drop constraint "+pgx.Identifier{pk}.Sanitize()); err != nil {
			return fmt.Errorf("drop the primary key of target table %s: %w", t, err)
		}
	}
	for _, c := range oldKey {
		if slices.Contains(newKey, c) {
			continue
		}
		if _, err := tx.Exec(ctx, "alter table "+t.Quoted()+" alter column "+pgx.Identifier{c}.Sanitize()+" drop not null"); err != nil {
			return fmt.Errorf("make the old key column %q of %s nullable: %w", c, t, err)
		}
	}
	return nil
}

// addKey gives target table t the source's key as primary key, inside tx. When the rows it holds
// do not fit the new key (NULLs in a column that was not a key, duplicates), they are removed
// first: the table is loaded again under the new key in any case, and until then coverage reports
// it as schema-changed.
func addKey(ctx context.Context, tx pgx.Tx, t changebatch.Table) error {
	var keys []string
	for _, i := range t.KeyOrder() {
		keys = append(keys, pgx.Identifier{t.Columns[i].Name}.Sanitize())
	}
	add := "alter table " + t.Quoted() + " add primary key (" + strings.Join(keys, ", ") + ")"
	if _, err := tx.Exec(ctx, "savepoint pgconverge_rekey"); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, add); err == nil {
		return nil
	}
	for _, stmt := range []string{"rollback to savepoint pgconverge_rekey", "delete from " + t.Quoted(), add} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("give target table %s the source's key (%s): %w", t, strings.Join(keys, ", "), err)
		}
	}
	return nil
}

// plan fills r with the differences between the target's columns and t, old being the shape the
// target's rows were streamed against, and returns the ALTER TABLE subcommands that remove them,
// one statement each. A target column holding another column's values than the source's of its
// name (old.replaces) is dropped and added again, whatever its type: its values are loaded again
// and never cast.
func (r *Reshape) plan(t changebatch.Table, cols []targetColumn, old sourceShape) []string {
	have := map[string]targetColumn{}
	for _, c := range cols {
		have[c.name] = c
	}
	var ddl []string
	for _, c := range t.Columns {
		q := pgx.Identifier{c.Name}.Sanitize()
		tc, ok := have[c.Name]
		if !ok {
			r.Added = append(r.Added, c.Name)
			ddl = append(ddl, "add column "+q+" "+c.Type)
			continue
		}
		if old.replaces(c) {
			r.Replaced = append(r.Replaced, c.Name)
			ddl = append(ddl, "drop column "+q, "add column "+q+" "+c.Type)
			continue
		}
		if tc.expr != "" {
			r.Plain = append(r.Plain, c.Name)
			ddl = append(ddl, "alter column "+q+" drop expression")
		}
		if tc.typ != c.Type {
			// A target domain over the source's type (a NOT NULL domain made plain, see
			// cdc.DescribeTable) holds the same values: changed without a reload.
			if tc.base != c.Type {
				r.Retyped = append(r.Retyped, fmt.Sprintf("%s: %s -> %s", c.Name, tc.typ, c.Type))
			}
			ddl = append(ddl, fmt.Sprintf("alter column %s type %s using %s::%s", q, c.Type, q, c.Type))
		}
	}
	generated := map[string]bool{}
	for _, g := range t.Generated {
		generated[g.Name] = true
		q := pgx.Identifier{g.Name}.Sanitize()
		tc, ok := have[g.Name]
		if ok && tc.expr == g.Expr && tc.typ == g.Type {
			continue
		}
		if ok {
			ddl = append(ddl, "drop column "+q)
		}
		r.Generated = append(r.Generated, g.Name)
		ddl = append(ddl, fmt.Sprintf("add column %s %s generated always as (%s) stored", q, g.Type, g.Expr))
	}
	for _, c := range cols {
		if t.ColumnIndex(c.name) >= 0 || generated[c.name] {
			continue
		}
		r.Kept = append(r.Kept, c.name)
		if c.expr != "" {
			r.Plain = append(r.Plain, c.name)
			ddl = append(ddl, "alter column "+pgx.Identifier{c.name}.Sanitize()+" drop expression")
		}
	}
	return ddl
}

// reshapeError names what the target refused and the fix that fits the error: a missing type or
// function (create it on the target), objects depending on a column it replaces (drop them), else
// a value that does not convert.
func reshapeError(t changebatch.Table, r Reshape, err error) error {
	what := fmt.Sprintf("change target table %s to the source's columns (added %q, replaced %q, changed type %q, generated %q, made plain %q)",
		t, r.Added, r.Replaced, r.Retyped, r.Generated, r.Plain)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case pgerrcode.UndefinedObject, pgerrcode.InvalidSchemaName:
			return fmt.Errorf("%s: %w; a type (or its schema) the source uses does not exist on the target: create it there first (CREATE TYPE, or CREATE EXTENSION for an extension's type), then restart", what, err)
		case pgerrcode.UndefinedFunction:
			return fmt.Errorf("%s: %w; a function a generated column's expression uses does not exist on the target: create it there first, then restart", what, err)
		case pgerrcode.DependentObjectsStillExist:
			return fmt.Errorf("%s: %w (%s); objects of yours on the target depend on a column pgconverge drops and adds again, because the source's column of that name is a new one: drop or change them (or drop the column by hand), and the daemon, which retries meanwhile, replaces the column and loads the table again",
				what, err, pgErr.Detail)
		}
	}
	return fmt.Errorf("%s: %w; change the target table by hand to the source's column types (ALTER TABLE %s ALTER COLUMN ... TYPE ... USING ...) or drop it (DROP TABLE %s CASCADE on the target: CASCADE drops its live view too, and any view of yours over it), then restart: pgconverge reloads the table either way",
		what, err, t.Quoted(), t.Quoted())
}

// RecordSchemaChange sets table t's schema_changed_lsn to changedAt (when later) and tells onReload
// (nil: nothing), which abandons its unfinished backfills, whose chunks may lack a column's values:
// backfills read before changedAt stop counting as coverage, so the table is loaded again.
func RecordSchemaChange(ctx context.Context, conn *pgx.Conn, t changebatch.TableName, changedAt pglogrepl.LSN, onReload ReloadFunc) error {
	if _, err := conn.Exec(ctx, `update pgconverge.tables set schema_changed_lsn = greatest(schema_changed_lsn, $3::pg_lsn)
where schema_name = $1 and table_name = $2`, t.Schema, t.Name, changedAt.String()); err != nil {
		return fmt.Errorf("record the schema change of %s: %w", t, err)
	}
	return onReload.reloaded(ctx, conn, t)
}
