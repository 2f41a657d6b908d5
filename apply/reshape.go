package apply

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Reshape is what EnsureTable changed in an existing target table to match the source table's
// description.
type Reshape struct {
	// Added are the columns it added (nullable, no default); Retyped describe the columns it
	// changed to the source's new type, as "name: old type -> new type".
	Added, Retyped []string
	// Kept are target columns the source table no longer has (dropped, or renamed there): they
	// stay, with the values they had, and nothing writes them any more.
	Kept []string
	// Generated are the generated columns it added, which the target computes for every row;
	// Plain are generated columns the source made plain (DROP EXPRESSION), made plain too.
	Generated, Plain []string
}

// Reloads reports whether the change leaves existing rows without the source's values, so that
// the table must be loaded again: an added or retyped column.
func (r Reshape) Reloads() bool { return len(r.Added)+len(r.Retyped) > 0 }

// targetColumn is a data column of a target table: its type as format_type prints it with
// schema-qualified names, and whether it is in the primary key.
type targetColumn struct {
	name, typ      string
	key, generated bool
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
		rows, err := tx.Query(ctx, `select a.attname, format_type(a.atttypid, a.atttypmod),
  coalesce(a.attnum = any (i.indkey::int2[]), false), a.attgenerated <> ''
from pg_attribute a left join pg_index i on i.indrelid = a.attrelid and i.indisprimary
where a.attrelid = $1::regclass and a.attnum > 0 and not a.attisdropped order by a.attnum`, t.Quoted())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c targetColumn
			if err := rows.Scan(&c.name, &c.typ, &c.key, &c.generated); err != nil {
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
// transaction (see EnsureTable), generated columns included; changedAt is recorded as the table's schema_changed_lsn when rows
// must be loaded again. It returns an error naming the fix when the metadata columns are missing,
// the key differs, or a column's values do not convert to its new type.
func reshape(ctx context.Context, conn *pgx.Conn, t changebatch.Table, changedAt pglogrepl.LSN) (Reshape, error) {
	var r Reshape
	cols, all, err := readTargetColumns(ctx, conn, t)
	if err != nil {
		return r, err
	}
	var missing []string
	for _, c := range []string{changebatch.ColLSN, changebatch.ColSeq, changebatch.ColDeleted, changebatch.ColUnknown} {
		if !all[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return r, fmt.Errorf("target table %s exists but lacks pgconverge's columns %s: drop it (DROP TABLE %s on the target) and restart, and pgconverge recreates and reloads it",
			t, strings.Join(missing, ", "), t.Quoted())
	}
	var srcKey, tgtKey []string
	for _, i := range t.KeyIndexes() {
		srcKey = append(srcKey, t.Columns[i].Name)
	}
	have := map[string]targetColumn{}
	for _, c := range cols {
		have[c.name] = c
		if c.key {
			tgtKey = append(tgtKey, c.name)
		}
	}
	slices.Sort(srcKey)
	slices.Sort(tgtKey)
	if !slices.Equal(srcKey, tgtKey) {
		return r, fmt.Errorf("the key of source table %s is (%s), the target table's primary key is (%s): pgconverge cannot change a target table's key; drop the target table (DROP TABLE %s on the target) and restart, and pgconverge recreates and reloads it",
			t, strings.Join(srcKey, ", "), strings.Join(tgtKey, ", "), t.Quoted())
	}
	var ddl []string
	for _, c := range t.Columns {
		q := pgx.Identifier{c.Name}.Sanitize()
		tc, ok := have[c.Name]
		switch {
		case !ok:
			r.Added = append(r.Added, c.Name)
			ddl = append(ddl, "add column "+q+" "+c.Type)
		case tc.generated:
			r.Plain = append(r.Plain, c.Name)
			ddl = append(ddl, "alter column "+q+" drop expression")
		}
		if ok && tc.typ != c.Type {
			r.Retyped = append(r.Retyped, fmt.Sprintf("%s: %s -> %s", c.Name, tc.typ, c.Type))
			ddl = append(ddl, fmt.Sprintf("alter column %s type %s using %s::%s", q, c.Type, q, c.Type))
		}
	}
	generated := map[string]bool{}
	for _, g := range t.Generated {
		generated[g.Name] = true
		if _, ok := have[g.Name]; !ok {
			r.Generated = append(r.Generated, g.Name)
			ddl = append(ddl, fmt.Sprintf("add column %s %s generated always as (%s) stored", pgx.Identifier{g.Name}.Sanitize(), g.Type, g.Expr))
		}
	}
	for _, c := range cols {
		if columnIndex(t, c.name) < 0 && !generated[c.name] {
			r.Kept = append(r.Kept, c.name)
		}
	}
	if len(ddl) == 0 {
		return r, nil
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "alter table "+t.Quoted()+" "+strings.Join(ddl, ", ")); err != nil {
			return err
		}
		if !r.Reloads() {
			return nil
		}
		return recordSchemaChange(ctx, tx.Conn(), t, changedAt)
	})
	if err != nil && !r.Reloads() {
		return r, fmt.Errorf("change target table %s to the source's generated columns (added %q, made plain %q): %w; create what the expressions need on the target (a function the source has) and restart",
			t, r.Generated, r.Plain, err)
	}
	if err != nil {
		// The table is loaded again once someone changed it by hand, so record that first.
		if rerr := recordSchemaChange(ctx, conn, t, changedAt); rerr != nil {
			return r, rerr
		}
		return r, fmt.Errorf("change target table %s to the source's columns (added %q, changed type %q) failed: %w; change the target table by hand to the source's column types (ALTER TABLE %s ALTER COLUMN ... TYPE ... USING ...) or drop it (DROP TABLE %s on the target), then restart: pgconverge reloads the table either way",
			t, r.Added, r.Retyped, err, t.Quoted(), t.Quoted())
	}
	return r, nil
}

// recordSchemaChange sets table t's schema_changed_lsn to changedAt (when later) and abandons its
// unfinished backfills, whose chunks may lack a column's values.
func recordSchemaChange(ctx context.Context, conn *pgx.Conn, t changebatch.Table, changedAt pglogrepl.LSN) error {
	if _, err := conn.Exec(ctx, `update pgconverge.tables set schema_changed_lsn = greatest(schema_changed_lsn, $3::pg_lsn)
where schema_name = $1 and table_name = $2`, t.Schema, t.Name, changedAt.String()); err != nil {
		return fmt.Errorf("record the schema change of %s: %w", t, err)
	}
	return abandonBackfills(ctx, conn, t.Schema, t.Name)
}

// columnIndex returns the position of the column named name in t.Columns, -1 when t has none.
func columnIndex(t changebatch.Table, name string) int {
	return slices.IndexFunc(t.Columns, func(c changebatch.Column) bool { return c.Name == name })
}
