package apply

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// sourceShape is what the target's rows of a table were streamed against, recorded in
// pgconverge.tables.source_shape: the source table's relfilenode and, per column name, its attnum,
// type and generation expression. A later description that differs in a way that can change
// values without a change pgoutput sends means the table must be loaded again (changes).
type sourceShape struct {
	Filenode uint32                 `json:"filenode"`
	Columns  map[string]shapeColumn `json:"columns"`
}

// shapeColumn is one column of a sourceShape.
type shapeColumn struct {
	Attnum  int16  `json:"attnum"`
	TypeOID uint32 `json:"type_oid"`
	TypeMod int32  `json:"type_mod"`
	// Expr is a generated column's expression, "" for others.
	Expr string `json:"expr,omitempty"`
}

// shapeOf returns the shape of description t.
func shapeOf(t changebatch.Table) sourceShape {
	s := sourceShape{Filenode: t.Filenode, Columns: map[string]shapeColumn{}}
	for _, c := range t.Columns {
		s.Columns[c.Name] = shapeColumn{Attnum: c.Attnum, TypeOID: c.TypeOID, TypeMod: c.TypeMod}
	}
	for _, g := range t.Generated {
		s.Columns[g.Name] = shapeColumn{Attnum: g.Attnum, Expr: g.Expr}
	}
	return s
}

// changes returns why rows streamed against old may hold other values than the source table of
// shape cur, which no change delivered: the table was rewritten (ALTER COLUMN ... TYPE, also to the
// same type with USING, ADD COLUMN with a volatile default, TRUNCATE, VACUUM FULL), or a column
// appeared (added, renamed, dropped and added again: another attnum), changed type or is no
// longer generated. A column that is gone needs nothing; a generated column's values are the
// target's to compute. Nil when
// old was never recorded.
func (old sourceShape) changes(cur sourceShape) []string {
	if old.Columns == nil {
		return nil
	}
	var out []string
	if old.Filenode != 0 && cur.Filenode != 0 && old.Filenode != cur.Filenode {
		out = append(out, fmt.Sprintf("table rewritten (relfilenode %d -> %d)", old.Filenode, cur.Filenode))
	}
	for _, name := range slices.Sorted(maps.Keys(cur.Columns)) {
		c, o := cur.Columns[name], old.Columns[name]
		switch _, had := old.Columns[name]; {
		case c.Expr != "":
		case !had:
			out = append(out, fmt.Sprintf("column %q appeared", name))
		case o.Expr != "":
			// Made plain (DROP EXPRESSION): rows written since by the source hold values a
			// backfill read meanwhile could not store on the target, where it was generated.
			out = append(out, fmt.Sprintf("column %q is no longer generated", name))
		case o.Attnum != 0 && c.Attnum != 0 && o.Attnum != c.Attnum:
			out = append(out, fmt.Sprintf("column %q was created again (attnum %d -> %d)", name, o.Attnum, c.Attnum))
		case o.TypeOID != c.TypeOID || o.TypeMod != c.TypeMod:
			out = append(out, fmt.Sprintf("column %q changed type", name))
		}
	}
	return out
}

// replaces reports whether the target's column of source column c's name holds the values of
// another column than c, so that it must be dropped and added again rather than kept or cast:
// old, the shape its rows were streamed against, lacks the name (the target kept the column
// after a DROP COLUMN or a rename on the source) or has it under another attnum (dropped and added
// again, or another column renamed onto its name). False when old was never recorded, or when an
// attnum is unknown.
func (old sourceShape) replaces(c changebatch.Column) bool {
	if old.Columns == nil {
		return false
	}
	o, had := old.Columns[c.Name]
	return !had || o.Attnum != 0 && c.Attnum != 0 && o.Attnum != c.Attnum
}

// ShapeChanges returns why target table t's rows may differ from the source table described as
// t (cdc.DescribeTable) in a way no streamed change shows, against the shape recorded when the
// stream last followed it (sourceShape.changes); nil when none, or when none was recorded.
func ShapeChanges(ctx context.Context, conn *pgx.Conn, t changebatch.Table) ([]string, error) {
	old, err := readShape(ctx, conn, t)
	if err != nil {
		return nil, err
	}
	return old.changes(shapeOf(t)), nil
}

// equal reports whether two shapes are the same.
func (old sourceShape) equal(cur sourceShape) bool {
	return old.Filenode == cur.Filenode && maps.Equal(old.Columns, cur.Columns)
}

// readShape returns table t's recorded shape; a zero shape when none was recorded.
func readShape(ctx context.Context, conn *pgx.Conn, t changebatch.Table) (sourceShape, error) {
	var s sourceShape
	var raw []byte
	err := conn.QueryRow(ctx, `select source_shape from pgconverge.tables where schema_name = $1 and table_name = $2`,
		t.Schema, t.Name).Scan(&raw)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("read the recorded source shape of %s: %w", t, err)
	}
	if len(raw) == 0 {
		return s, nil
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return s, fmt.Errorf("read the recorded source shape of %s: %w", t, err)
	}
	return s, nil
}

// writeShape records table t's shape.
func writeShape(ctx context.Context, conn *pgx.Conn, t changebatch.Table, s sourceShape) error {
	raw, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `update pgconverge.tables set source_shape = $3 where schema_name = $1 and table_name = $2`,
		t.Schema, t.Name, raw); err != nil {
		return fmt.Errorf("record the source shape of %s: %w", t, err)
	}
	return nil
}
