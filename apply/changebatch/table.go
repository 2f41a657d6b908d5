package changebatch

import (
	"errors"
	"fmt"
	"sort"
	"strings"
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

// Table describes a replicated table: its schema-qualified name (String and Quoted come from
// TableName) and its columns in the order the producer emits them.
type Table struct {
	TableName
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
	// RowFilter is the publication's row filter for the table (PostgreSQL docs §31.3 "Row
	// Filters"; pg_publication_tables.rowfilter), a boolean SQL expression over the table's
	// columns, "" when it has none: the stream only sees the rows it admits, so snapshot reads
	// keep only those too (SourceRelation).
	RowFilter string
	// ColumnList is set when the publication publishes only some of the source table's columns
	// (PostgreSQL docs §31.4 "Column Lists"): Columns are those, and the source's other columns
	// (generated ones included) are not replicated, nor compared by the schema checks.
	ColumnList bool
	// Keyless marks a table without a primary key or replica identity index whose replica
	// identity is FULL (PostgreSQL docs §31.1 "Publication"): pgoutput sends every old value of an
	// UPDATE or DELETE, so a row is identified by its whole value. The target holds one entry per
	// occurrence of a row value (docs/design.md, "Tables without a key"); Columns has no Key.
	Keyless bool
	// SnapshotOnly is why no publication can carry the table's changes, "" when one can: it is
	// UNLOGGED (PostgreSQL writes no WAL for it), or it has no key and its replica identity is not
	// FULL (published, its UPDATEs and DELETEs would fail on the source). Such a table is kept by
	// backfills only, each a complete snapshot of it.
	SnapshotOnly string
}

// Shape returns what of the source table t stands for, as text: "" for the whole table, else
// its row filter and, with a column list, its columns. Two descriptions with the same shape read
// the same rows and columns.
func (t Table) Shape() string {
	if t.RowFilter == "" && !t.ColumnList {
		return ""
	}
	s := "where " + t.RowFilter
	if t.ColumnList {
		names := make([]string, len(t.Columns))
		for i, c := range t.Columns {
			names[i] = c.Name
		}
		s += "; columns " + strings.Join(names, ", ")
	}
	return s
}

// SourceRelation returns what a read of t on the source selects from, as a FROM item named
// alias: the table only (not the tables that inherit from it, which replicate as tables of their
// own), or, for a partitioned table, which has no rows of its own, the table with all its
// partitions; with a row filter, only the rows it admits.
func (t Table) SourceRelation(alias string) string {
	rel := "only " + t.Quoted()
	if t.Partitioned {
		rel = t.Quoted()
	}
	if t.RowFilter != "" {
		return "(select * from " + rel + " where (" + t.RowFilter + ")) as " + alias
	}
	return rel + " as " + alias
}

// Reserved column names that the target tables add; a source table may not use them.
const (
	ColLSN       = "_cdc_lsn"
	ColSeq       = "_cdc_seq"
	ColOp        = "_cdc_op"
	ColUnchanged = "_cdc_unchanged"
	ColDeleted   = "_cdc_deleted"
	ColUnknown   = "_cdc_unknown"
	// The columns of a keyless table's target entries (Table.Keyless): the row value's hash, the
	// occurrence's number within its version, and the version of the change that deleted it.
	ColRowHash    = "_cdc_row_hash"
	ColOccurrence = "_cdc_occurrence"
	ColDeletedLSN = "_cdc_deleted_lsn"
	ColDeletedSeq = "_cdc_deleted_seq"
)

// IsReserved reports whether name is one of the metadata column names pgconverge adds.
func IsReserved(name string) bool {
	switch name {
	case ColLSN, ColSeq, ColOp, ColUnchanged, ColDeleted, ColUnknown, ColRowHash, ColOccurrence, ColDeletedLSN, ColDeletedSeq:
		return true
	}
	return false
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

// ErrNoKey is wrapped by the error for a table without a usable key: Validate's for one without
// key columns, and the source's description of a partitioned one without a key.
var ErrNoKey = errors.New("no key")

// Validate reports every problem of the description at once: no key column (unless Keyless), a
// key column in a keyless table, an empty or duplicate column name, a column name reserved for
// pgconverge's metadata.
func (t Table) Validate() error {
	var errs []error
	if t.Schema == "" || t.Name == "" {
		errs = append(errs, fmt.Errorf("table %q: schema and name must be set", t.String()))
	}
	if t.Keyless && len(t.KeyIndexes()) > 0 {
		errs = append(errs, fmt.Errorf("table %s: described as keyless but has key columns", t))
	}
	if !t.Keyless && len(t.KeyIndexes()) == 0 {
		errs = append(errs, fmt.Errorf("table %s has no primary key or replica identity index: add one (ALTER TABLE %s ADD PRIMARY KEY (...)) or replicate it by its whole rows (ALTER TABLE %s REPLICA IDENTITY FULL), or leave the table out: %w", t, t.Quoted(), t.Quoted(), ErrNoKey))
	}
	seen := map[string]bool{}
	for _, c := range t.Columns {
		switch {
		case c.Name == "":
			errs = append(errs, fmt.Errorf("table %s: a column has no name", t))
		case seen[c.Name]:
			errs = append(errs, fmt.Errorf("table %s: column %q appears twice", t, c.Name))
		case IsReserved(c.Name), t.Keyless && strings.HasPrefix(c.Name, "_cdc_"):
			errs = append(errs, fmt.Errorf("table %s: column %q uses a name pgconverge reserves for its metadata (for a table without a key, every name beginning with _cdc_); rename it", t, c.Name))
		}
		seen[c.Name] = true
	}
	return errors.Join(errs...)
}
