package cdc

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/disposition"
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
	// KeyChanged is true when the catalog shows another key, Rewritten when it shows another
	// relfilenode or a column with another attnum (ChangedColumns).
	KeyChanged, Rewritten bool
	// Reload is true when values of the transaction at LSN cannot be written as the stream
	// carries them (a column it lacks or types otherwise than the description, or another key)
	// and no reload is recorded past LSN: the caller records one (apply.RecordSchemaChange) before
	// streaming again.
	Reload bool
}

// Mark says that the daemon restarts the session at once (reason "restart"), for the next one to
// describe the table again.
func (e *SchemaChangeError) Mark() disposition.Mark {
	return disposition.Mark{Action: disposition.Restart, Reason: disposition.ReasonRestart}
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
	if e.Rewritten {
		parts = append(parts, "it was rewritten or a column was created again")
	}
	if e.Reload {
		parts = append(parts, "a change streamed against older columns needs a reload")
	}
	if len(e.Added)+len(e.Dropped)+len(e.Retyped) == 0 && !e.KeyChanged && e.Rewritten {
		return fmt.Sprintf("source table %s was rewritten (seen at %s): it has new storage, as after TRUNCATE, VACUUM FULL, CLUSTER, SET LOGGED/UNLOGGED or an ALTER TABLE that rewrites it, which can change rows with no change the stream carries",
			e.Table, e.LSN)
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
	// generated marks a stored generated column (catalog only: Relation messages omit them).
	generated bool
	// attnum is the column's attnum, 0 when unknown (Relation messages).
	attnum int16
}

// compareRelation returns how the Relation message m differs from the description t, nil when it
// does not (compareColumns).
func compareRelation(t changebatch.Table, m *pglogrepl.RelationMessage, lsn pglogrepl.LSN) *SchemaChangeError {
	cols := make([]columnType, len(m.Columns))
	for i, c := range m.Columns {
		cols[i] = columnType{name: c.Name, typeOID: c.DataType, typeMod: c.TypeModifier, keyPos: -1}
	}
	ch := compareColumns(t, cols, lsn, false)
	if relationKeyChanged(t, m) {
		if ch == nil {
			ch = &SchemaChangeError{Table: t, LSN: lsn}
		}
		ch.KeyChanged = true
	}
	return ch
}

// relationKeyChanged reports whether the Relation message m names other replica identity columns
// (flag 1, PostgreSQL docs §55.5 "Relation") than the description's key: a primary key dropped
// and added on other columns, or REPLICA IDENTITY USING INDEX switched to another index. With
// REPLICA IDENTITY FULL every column is flagged, and the key is the primary key, which m cannot
// show.
func relationKeyChanged(t changebatch.Table, m *pglogrepl.RelationMessage) bool {
	if m.ReplicaIdentity == 'f' {
		return false
	}
	var flagged, key []string
	for _, c := range m.Columns {
		if c.Flags&1 != 0 {
			flagged = append(flagged, c.Name)
		}
	}
	for _, i := range t.KeyIndexes() {
		key = append(key, t.Columns[i].Name)
	}
	slices.Sort(flagged)
	slices.Sort(key)
	return !slices.Equal(flagged, key)
}

// compareColumns returns how cols differ from the description t, nil when they do not: columns
// are matched by name; a column whose description has no type oid (a table described without
// one) is not compared by type. Generated columns are compared with t.Generated by name when
// withGenerated is set (cols come from the catalog), else ignored. With a column list
// (t.ColumnList) columns outside it are ignored.
func compareColumns(t changebatch.Table, cols []columnType, lsn pglogrepl.LSN, withGenerated bool) *SchemaChangeError {
	ch := &SchemaChangeError{Table: t, LSN: lsn}
	seen := map[string]bool{}
	for _, c := range cols {
		if t.ColumnList && t.ColumnIndex(c.name) < 0 {
			continue // not published: its changes do not reach the target
		}
		seen[c.name] = true
		if c.generated {
			if !slices.ContainsFunc(t.Generated, func(g changebatch.GeneratedColumn) bool { return g.Name == c.name }) {
				ch.Added = append(ch.Added, c.name)
			}
			continue
		}
		i := t.ColumnIndex(c.name)
		switch {
		case i < 0:
			ch.Added = append(ch.Added, c.name)
		case t.Columns[i].TypeOID != 0 && (t.Columns[i].TypeOID != c.typeOID || t.Columns[i].TypeMod != c.typeMod):
			ch.Retyped = append(ch.Retyped, c.name)
		case c.keyPos >= 0 && c.keyPos != t.Columns[i].KeyPos:
			ch.KeyChanged = true
		case c.attnum != 0 && t.Columns[i].Attnum != 0 && c.attnum != t.Columns[i].Attnum:
			ch.Rewritten = true
		}
	}
	for _, c := range t.Columns {
		if !seen[c.Name] {
			ch.Dropped = append(ch.Dropped, c.Name)
		}
	}
	for _, g := range t.Generated {
		if withGenerated && !seen[g.Name] {
			ch.Dropped = append(ch.Dropped, g.Name)
		}
	}
	if len(ch.Added)+len(ch.Dropped)+len(ch.Retyped) == 0 && !ch.KeyChanged && !ch.Rewritten {
		return nil
	}
	return ch
}

// ChangedColumns compares the source catalog's columns (names, types, attnums), generated
// columns, key, replica identity (lostIdentity) and relfilenode of each table (found by its SourceOID) with its description, and returns the first
// difference as a *SchemaChangeError whose LSN is at, the source position the caller read before
// the catalog; nil when every table is as described. It catches a change no Relation message
// shows: ADD COLUMN ... DEFAULT fills existing rows with no change that pgoutput sends, and a
// rewrite (ALTER COLUMN ... TYPE ... USING, also to the same type) changes them. A
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
	// The key as keyColumns reads it: the replica identity index, else the primary key unless it
	// is DEFERRABLE (then there is none, and the table is followed by whole rows or snapshots).
	rows, err := conn.Query(ctx, `select a.attrelid, a.attname, a.atttypid, a.atttypmod,
  coalesce(array_position((select i.indkey[0:i.indnkeyatts-1]::int2[] from pg_index i join pg_class c on c.oid = i.indrelid
    where i.indrelid = a.attrelid and case when c.relreplident = 'i' then i.indisreplident else i.indisprimary and i.indimmediate end), a.attnum), 0),
  a.attgenerated <> '', a.attnum, coalesce(pg_relation_filenode(a.attrelid), 0),
  (select relreplident::text from pg_class where oid = a.attrelid)
from pg_attribute a
where a.attrelid = any($1) and a.attnum > 0 and not a.attisdropped order by a.attrelid, a.attnum`, oids)
	if err != nil {
		return nil, fmt.Errorf("read the source tables' columns: %w", err)
	}
	cols := map[uint32][]columnType{}
	filenodes := map[uint32]uint32{}
	identities := map[uint32]string{}
	for rows.Next() {
		var oid, filenode uint32
		var c columnType
		var identity string
		if err := rows.Scan(&oid, &c.name, &c.typeOID, &c.typeMod, &c.keyPos, &c.generated, &c.attnum, &filenode, &identity); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the source tables' columns: %w", err)
		}
		cols[oid] = append(cols[oid], c)
		filenodes[oid], identities[oid] = filenode, identity
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the source tables' columns: %w", err)
	}
	for _, oid := range oids {
		if cs, ok := cols[oid]; ok {
			t := byOID[oid]
			ch := compareColumns(t, cs, at, true)
			if ch == nil && t.Filenode != 0 && filenodes[oid] != 0 && t.Filenode != filenodes[oid] {
				ch = &SchemaChangeError{Table: t, LSN: at, Rewritten: true}
			}
			if ch == nil && lostIdentity(t, identities[oid]) {
				ch = &SchemaChangeError{Table: t, LSN: at, KeyChanged: true}
			}
			if ch != nil {
				// The target table takes the new key and is loaded again under it.
				ch.Reload = ch.Reload || ch.KeyChanged
				return ch, nil
			}
		}
	}
	return nil, nil
}

// lostIdentity reports whether streamed table t (not kept by snapshots) has lost the replica
// identity it was described with, as identity (pg_class.relreplident) shows while no key column
// changed: one followed by whole rows is no longer REPLICA IDENTITY FULL, one followed by its key
// is REPLICA IDENTITY NOTHING. The source refuses its application's UPDATEs and DELETEs from then
// on; no Relation message shows it until the table's next change.
func lostIdentity(t changebatch.Table, identity string) bool {
	if t.SnapshotOnly != "" || identity == "" {
		return false
	}
	if t.Keyless {
		return identity != "f"
	}
	return identity == "n"
}
