package changebatch

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Column is one column of a replicated table.
type Column struct {
	// Name is the column's name as PostgreSQL stores it (not quoted).
	Name string
	// Type is the SQL type as format_type(atttypid, atttypmod) prints it, for example
	// "character varying(10)"; it is used to create the target table.
	Type string
	// Key marks a column of the replica identity key (the primary key by default).
	Key bool
	// KeyPos is the column's 1-based position in the key's index, 0 when unknown or not a key
	// column; KeyOrder uses it.
	KeyPos int
	// TypeOID and TypeMod are the source's atttypid and atttypmod, as pgoutput Relation messages
	// carry them; 0 and 0 when unknown (they do not travel in batch schemas). The stream compares
	// them to notice a column whose type changed.
	TypeOID uint32
	TypeMod int32
	// Attnum is the source's attnum, 0 when unknown: a column dropped and added again under the
	// same name gets another one.
	Attnum int16
}

// GeneratedColumn is a stored generated column of a source table (GENERATED ALWAYS AS (Expr)
// STORED). pgoutput in PostgreSQL 15 does not send its values, so batches do not carry it: the
// target table has it as a generated column too and computes it from the replicated columns
// (PostgreSQL requires the expression to be immutable, so it gives the source's values).
type GeneratedColumn struct {
	// Name is the column's name (not quoted); Type is as in Column; Expr is the generation
	// expression as pg_get_expr prints it, functions qualified with their schema.
	Name, Type, Expr string
	// Attnum is the source's attnum.
	Attnum int16
}

// Table describes a replicated table: its schema-qualified name and its columns in the order the
// producer emits them.
type Table struct {
	Schema  string
	Name    string
	Columns []Column
	// Generated are the source table's stored generated columns, which batches do not carry.
	Generated []GeneratedColumn
	// Filenode is the source table's relfilenode when described (0 for a partitioned table or
	// when unknown): a rewrite (ALTER COLUMN ... TYPE, ADD COLUMN with a volatile default, TRUNCATE,
	// VACUUM FULL) changes it, and may change values with no change pgoutput sends.
	Filenode uint32
	// SourceOID is the source relation's oid when the producer knows it (cdc.DescribeTable), else
	// 0. The stream matches pgoutput Relation messages by it, so a table renamed on the source, or
	// moved to another schema, and back, keeps its changes.
	SourceOID uint32
	// Partitioned marks a partitioned source table (relkind 'p'), replicated as one table: it
	// has no storage of its own, so snapshot reads cover all its partitions.
	Partitioned bool
}

// Reserved column names that the target tables add; a source table may not use them.
const (
	ColLSN       = "_cdc_lsn"
	ColSeq       = "_cdc_seq"
	ColOp        = "_cdc_op"
	ColUnchanged = "_cdc_unchanged"
	ColDeleted   = "_cdc_deleted"
	ColUnknown   = "_cdc_unknown"
)

// IsReserved reports whether name is one of the metadata column names pgconverge adds.
func IsReserved(name string) bool {
	switch name {
	case ColLSN, ColSeq, ColOp, ColUnchanged, ColDeleted, ColUnknown:
		return true
	}
	return false
}

// String returns the table's name for logs, errors and map keys: schema.name, with a part
// double-quoted only when it needs quoting (QualifiedName). Build SQL with Quoted instead.
func (t Table) String() string { return QualifiedName(t.Schema, t.Name) }

// Quoted returns the table's name quoted for SQL: "schema"."name".
func (t Table) Quoted() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

var plainName = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// QualifiedName renders schema.name for people: a part that is lower-case letters, digits and
// underscores stays bare, any other part is double-quoted as in SQL (`"My Schema".t`). It is
// unambiguous, so it also serves as a map key.
func QualifiedName(schema, name string) string {
	part := func(p string) string {
		if plainName.MatchString(p) {
			return p
		}
		return `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return part(schema) + "." + part(name)
}

// KeyOrder returns the positions of the key columns in Columns in the order of the key's index
// (KeyPos), which is the order in which the index sorts rows; columns without a KeyPos keep their
// column order after those with one.
func (t Table) KeyOrder() []int {
	idx := t.KeyIndexes()
	sort.SliceStable(idx, func(a, b int) bool {
		pa, pb := t.Columns[idx[a]].KeyPos, t.Columns[idx[b]].KeyPos
		return pa != 0 && (pb == 0 || pa < pb)
	})
	return idx
}

// ColumnIndex returns the position in Columns of the column named name (unquoted), -1 when the
// table has none.
func (t Table) ColumnIndex(name string) int {
	for i, c := range t.Columns {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// KeyIndexes returns the positions of the key columns in Columns, in column order.
func (t Table) KeyIndexes() []int {
	var idx []int
	for i, c := range t.Columns {
		if c.Key {
			idx = append(idx, i)
		}
	}
	return idx
}

// Validate reports every problem of the description at once: no key column, an empty or duplicate
// column name, a column name reserved for pgconverge's metadata.
func (t Table) Validate() error {
	var errs []error
	if t.Schema == "" || t.Name == "" {
		errs = append(errs, fmt.Errorf("table %q: schema and name must be set", t.String()))
	}
	if len(t.KeyIndexes()) == 0 {
		errs = append(errs, fmt.Errorf("table %s has no primary key or replica identity index: add one (ALTER TABLE %s ADD PRIMARY KEY (...)), or leave the table out", t, t.Quoted()))
	}
	seen := map[string]bool{}
	for _, c := range t.Columns {
		switch {
		case c.Name == "":
			errs = append(errs, fmt.Errorf("table %s: a column has no name", t))
		case seen[c.Name]:
			errs = append(errs, fmt.Errorf("table %s: column %q appears twice", t, c.Name))
		case IsReserved(c.Name):
			errs = append(errs, fmt.Errorf("table %s: column %q uses a name pgconverge reserves for its metadata; rename it", t, c.Name))
		}
		seen[c.Name] = true
	}
	return errors.Join(errs...)
}

// ParseTableName splits "schema.table" into its parts. A name without a schema means "public".
// Double-quoted parts keep dots and case: `"My Schema"."T.1"`.
func ParseTableName(s string) (schema, name string, err error) {
	parts, err := splitQualified(s)
	if err != nil {
		return "", "", fmt.Errorf("table name %q: %w", s, err)
	}
	switch len(parts) {
	case 1:
		return "public", parts[0], nil
	case 2:
		return parts[0], parts[1], nil
	}
	return "", "", fmt.Errorf("table name %q: want schema.table", s)
}

// SplitTableList splits a comma-separated list of table names, keeping commas inside double
// quotes: `a.b,"x,y".z` is ["a.b", `"x,y".z`]. Parse each element with ParseTableName.
func SplitTableList(s string) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

func splitQualified(s string) ([]string, error) {
	var parts []string
	var cur strings.Builder
	quoted, wasQuoted := false, false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quoted && ch == '"' && i+1 < len(s) && s[i+1] == '"':
			cur.WriteByte('"')
			i++
		case ch == '"':
			quoted = !quoted
			wasQuoted = true
		case ch == '.' && !quoted:
			parts = append(parts, finishPart(cur.String(), wasQuoted))
			cur.Reset()
			wasQuoted = false
		default:
			cur.WriteByte(ch)
		}
	}
	if quoted {
		return nil, errors.New("unterminated double quote")
	}
	parts = append(parts, finishPart(cur.String(), wasQuoted))
	for _, p := range parts {
		if p == "" {
			return nil, errors.New("empty name part")
		}
	}
	return parts, nil
}

// finishPart folds an unquoted part to lower case, as PostgreSQL does with unquoted identifiers.
func finishPart(p string, quoted bool) string {
	if quoted {
		return p
	}
	return strings.ToLower(p)
}
