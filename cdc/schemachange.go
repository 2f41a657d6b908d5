package cdc

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// SchemaChangeError ends a stream when a pgoutput Relation message shows that a replicated table's
// columns changed after the table was described (StreamConfig.DescribedAt): a column was added,
// dropped or renamed, or changed type. Nothing of the transaction that carries the message has
// been applied; the caller describes the table again, brings the target table in line
// (apply.EnsureTable) and streams again from the target's progress.
type SchemaChangeError struct {
	Table changebatch.Table
	// LSN is the commit LSN of the transaction whose Relation message showed the change, or, for a
	// change ChangedColumns found in the catalog, the source position read before it looked.
	LSN pglogrepl.LSN
	// Added are columns the Relation message has and the description lacks (added, or the new
	// name of a renamed column); Dropped the reverse; Retyped columns have another type oid or
	// type modifier.
	Added, Dropped, Retyped []string
	// KeyChanged is true when the catalog shows another key (ChangedColumns).
	KeyChanged bool
}

// Error describes the change.
func (e *SchemaChangeError) Error() string {
	var parts []string
	for _, p := range []struct {
		what string
		cols []string
	}{{"added", e.Added}, {"dropped or renamed", e.Dropped}, {"changed type", e.Retyped}} {
		if len(p.cols) > 0 {
			parts = append(parts, fmt.Sprintf("%s %q", p.what, p.cols))
		}
	}
	if e.KeyChanged {
		parts = append(parts, "its key changed")
	}
	return fmt.Sprintf("source table %s changed its columns (seen at %s): %s",
		e.Table, e.LSN, strings.Join(parts, "; "))
}

// columnType is a column as the catalog and pgoutput Relation messages identify it.
type columnType struct {
	name    string
	typeOID uint32
	typeMod int32
	// keyPos is the column's position in the key (changebatch.Column.KeyPos); -1 when unknown.
	keyPos int
}

// compareRelation returns how the Relation message m differs from the description t, nil when it
// does not (compareColumns).
func compareRelation(t changebatch.Table, m *pglogrepl.RelationMessage, lsn pglogrepl.LSN) *SchemaChangeError {
	cols := make([]columnType, len(m.Columns))
	for i, c := range m.Columns {
		cols[i] = columnType{c.Name, c.DataType, c.TypeModifier, -1}
	}
	return compareColumns(t, cols, lsn)
}

// compareColumns returns how cols differ from the description t, nil when they do not: columns
// are matched by name; a column whose description has no type oid (a table described without
// one) is not compared by type.
func compareColumns(t changebatch.Table, cols []columnType, lsn pglogrepl.LSN) *SchemaChangeError {
	ch := &SchemaChangeError{Table: t, LSN: lsn}
	seen := map[string]bool{}
	for _, c := range cols {
		seen[c.name] = true
		i := columnIndex(t, c.name)
		switch {
		case i < 0:
			ch.Added = append(ch.Added, c.name)
		case t.Columns[i].TypeOID != 0 && (t.Columns[i].TypeOID != c.typeOID || t.Columns[i].TypeMod != c.typeMod):
			ch.Retyped = append(ch.Retyped, c.name)
		case c.keyPos >= 0 && c.keyPos != t.Columns[i].KeyPos:
			ch.KeyChanged = true
		}
	}
	for _, c := range t.Columns {
		if !seen[c.Name] {
			ch.Dropped = append(ch.Dropped, c.Name)
		}
	}
	if len(ch.Added)+len(ch.Dropped)+len(ch.Retyped) == 0 && !ch.KeyChanged {
		return nil
	}
	return ch
}

// ChangedColumns compares the source catalog's columns and key of each table (found by its SourceOID;
// generated columns excluded, as in DescribeTable) with its description, and returns the first
// difference as a *SchemaChangeError whose LSN is at, the source position the caller read before
// the catalog; nil when every table is as described. It catches a change no Relation message
// shows yet: ADD COLUMN ... DEFAULT fills existing rows with no change that pgoutput sends. A
// table dropped from the source is left to the stream.
func ChangedColumns(ctx context.Context, conn *pgx.Conn, tables []changebatch.Table, at pglogrepl.LSN) (*SchemaChangeError, error) {
	byOID := map[uint32]changebatch.Table{}
	var oids []uint32
	for _, t := range tables {
		if t.SourceOID != 0 {
			byOID[t.SourceOID] = t
			oids = append(oids, t.SourceOID)
		}
	}
	// The key as keyColumns reads it: the replica identity index, else the primary key.
	rows, err := conn.Query(ctx, `select a.attrelid, a.attname, a.atttypid, a.atttypmod,
  coalesce(array_position((select i.indkey[0:i.indnkeyatts-1]::int2[] from pg_index i join pg_class c on c.oid = i.indrelid
    where i.indrelid = a.attrelid and case when c.relreplident = 'i' then i.indisreplident else i.indisprimary end), a.attnum), 0)
from pg_attribute a
where a.attrelid = any($1) and a.attnum > 0 and not a.attisdropped and a.attgenerated = '' order by a.attrelid, a.attnum`, oids)
	if err != nil {
		return nil, fmt.Errorf("read the source tables' columns: %w", err)
	}
	cols := map[uint32][]columnType{}
	for rows.Next() {
		var oid uint32
		var c columnType
		if err := rows.Scan(&oid, &c.name, &c.typeOID, &c.typeMod, &c.keyPos); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the source tables' columns: %w", err)
		}
		cols[oid] = append(cols[oid], c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the source tables' columns: %w", err)
	}
	for _, oid := range oids {
		if cs, ok := cols[oid]; ok {
			if ch := compareColumns(byOID[oid], cs, at); ch != nil {
				return ch, nil
			}
		}
	}
	return nil, nil
}

// columnIndex returns the position of the column named name in t.Columns, -1 when t has none.
func columnIndex(t changebatch.Table, name string) int {
	for i, c := range t.Columns {
		if c.Name == name {
			return i
		}
	}
	return -1
}
