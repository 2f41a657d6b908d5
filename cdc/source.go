package cdc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// CheckSource reports every reason the source cannot be streamed from, joined: wal_level is not
// logical, the role may not replicate, no replication slot is free, or it is a standby in recovery
// that cannot decode (checkStandby). Each error names the setting and the fix.
func CheckSource(ctx context.Context, conn *pgx.Conn) error {
	var walLevel, role string
	var canReplicate, standby bool
	var maxSlots int
	err := conn.QueryRow(ctx, `select current_setting('wal_level'), current_user::text,
  (select rolreplication or rolsuper from pg_roles where rolname = current_user),
  current_setting('max_replication_slots')::int, pg_is_in_recovery()`).Scan(&walLevel, &role, &canReplicate, &maxSlots, &standby)
	if err != nil {
		return fmt.Errorf("read source settings: %w", err)
	}
	var errs []error
	if standby {
		errs = append(errs, checkStandby(ctx, conn)...)
	}
	if walLevel != "logical" {
		errs = append(errs, fmt.Errorf("source wal_level is %q, logical replication needs 'logical': run ALTER SYSTEM SET wal_level = logical and restart the source", walLevel))
	}
	if !canReplicate {
		errs = append(errs, fmt.Errorf("source role %q may not replicate: run ALTER ROLE %s REPLICATION on the source (or connect as a role that has it)", role, pgx.Identifier{role}.Sanitize()))
	}
	if maxSlots == 0 {
		errs = append(errs, errors.New("source max_replication_slots is 0: set it to at least 2 and restart the source"))
	}
	return errors.Join(errs...)
}

// Why a table is kept by snapshots only (changebatch.Table.SnapshotOnly).
const (
	SnapshotOnlyUnlogged = "UNLOGGED: PostgreSQL writes no WAL for it, so no publication can carry its changes (ALTER TABLE … SET LOGGED makes it streamable)"
	SnapshotOnlyNothing  = "REPLICA IDENTITY NOTHING: a publication carrying its UPDATEs and DELETEs would make the source refuse them (ALTER TABLE … REPLICA IDENTITY DEFAULT makes it streamable)"
	SnapshotOnlyNoKey    = "no primary key or replica identity index, and REPLICA IDENTITY is not FULL: a publication carrying its UPDATEs and DELETEs would make the source refuse them (ALTER TABLE … ADD PRIMARY KEY, or REPLICA IDENTITY FULL, makes it streamable)"
	// SnapshotOnlyDeferrable is a table whose only key is a DEFERRABLE primary key, which
	// PostgreSQL cannot use as replica identity (CREATE TABLE, "DEFERRABLE"; §31.1).
	SnapshotOnlyDeferrable = "its primary key is DEFERRABLE, which PostgreSQL cannot use as replica identity: a publication carrying its UPDATEs and DELETEs would make the source refuse them (REPLICA IDENTITY FULL makes it streamable by whole rows; a NOT DEFERRABLE key, by its key)"
)

// DescribeTable reads table schema.name from the source catalog: its columns in attribute order
// (without generated columns, which pgoutput in PostgreSQL 15 does not send: they are described
// apart, in Generated) and its replica identity key; a table without a key whose replica identity
// is FULL is described as Keyless. It returns an error naming the table and the
// fix when the table is missing, is not an ordinary or partitioned table, has no usable key, or is
// partitioned with a partition that is not an ordinary table. A partitioned table is described as
// one table with its own columns and key.
func DescribeTable(ctx context.Context, conn *pgx.Conn, schema, name string) (changebatch.Table, error) {
	t := changebatch.Table{TableName: changebatch.TableName{Schema: schema, Name: name}}
	var oid uint32
	var kind, ident, persistence string
	var usage, sel bool
	err := conn.QueryRow(ctx, `select c.oid, c.relkind::text, c.relreplident::text, c.relpersistence::text,
  has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT')
from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname = $1 and c.relname = $2`,
		schema, name).Scan(&oid, &kind, &ident, &persistence, &usage, &sel)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("source table %s does not exist: check the table name (schema.table; unquoted names fold to lower case, as in SQL)", t)
	}
	if err != nil {
		return t, fmt.Errorf("read source table %s: %w", t, err)
	}
	if kind != "r" && kind != "p" {
		return t, fmt.Errorf("source relation %s is not an ordinary or partitioned table (relkind %q): only tables can be replicated", t, kind)
	}
	switch persistence {
	case "u":
		t.SnapshotOnly = SnapshotOnlyUnlogged
	case "t":
		return t, fmt.Errorf("source table %s is a temporary table: it exists only in the session that created it and cannot be published; leave it out", t)
	}
	if kind == "p" {
		if err := checkLeaves(ctx, conn, changebatch.TableName{Schema: schema, Name: name}, oid); err != nil {
			return t, err
		}
		t.Partitioned = true
	}
	if !usage || !sel {
		return t, fmt.Errorf("source role may not read table %s: run GRANT USAGE ON SCHEMA %s TO <role>; GRANT SELECT ON %s TO <role> on the source",
			t, pgx.Identifier{schema}.Sanitize(), t.Quoted())
	}
	if ident == "n" && t.SnapshotOnly == "" {
		t.SnapshotOnly = SnapshotOnlyNothing
	}
	t.SourceOID = oid
	deferrable, err := hasDeferrableKey(ctx, conn, oid, ident)
	if err != nil {
		return t, fmt.Errorf("read key of source table %s: %w", t, err)
	}
	keys, err := keyColumns(ctx, conn, oid, ident)
	if err != nil {
		return t, fmt.Errorf("read key of source table %s: %w", t, err)
	}
	// Type names are qualified with their schema whatever the session's search_path (format_type
	// omits the schemas it finds on the search_path), so the target resolves the same types.
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `set local search_path to pg_catalog`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `select attname, format_type(atttypid, atttypmod), attnum, atttypid, atttypmod from pg_attribute
where attrelid = $1 and attnum > 0 and not attisdropped and attgenerated = '' order by attnum`, oid)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c changebatch.Column
			var num int16
			if err := rows.Scan(&c.Name, &c.Type, &num, &c.TypeOID, &c.TypeMod); err != nil {
				return err
			}
			c.KeyPos, c.Attnum = keys[num], num
			c.Key = c.KeyPos > 0
			t.Columns = append(t.Columns, c)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if err := useNotNullDomainBases(ctx, tx, t.Columns); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `select coalesce(pg_relation_filenode($1::oid::regclass), 0)`, oid).Scan(&t.Filenode); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `select a.attname, format_type(a.atttypid, a.atttypmod), pg_get_expr(d.adbin, d.adrelid), a.attnum
from pg_attribute a join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
where a.attrelid = $1 and a.attnum > 0 and not a.attisdropped and a.attgenerated = 's' order by a.attnum`, oid)
		if err != nil {
			return err
		}
		t.Generated, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (changebatch.GeneratedColumn, error) {
			var g changebatch.GeneratedColumn
			return g, r.Scan(&g.Name, &g.Type, &g.Expr, &g.Attnum)
		})
		return err
	})
	if err != nil {
		return t, fmt.Errorf("read columns of source table %s: %w", t, err)
	}
	// REPLICA IDENTITY FULL without a primary key (or with a DEFERRABLE one, which is no key: one
	// statement may pass through duplicate keys, UPDATE t SET id = id + 1): pgoutput sends whole
	// old rows, which identify the row by its value. A table kept by snapshots alone is identified
	// alike when it has no key.
	t.Keyless = len(keys) == 0 && (ident == "f" || t.SnapshotOnly != "")
	if len(keys) == 0 && !t.Keyless && !t.Partitioned {
		t.Keyless, t.SnapshotOnly = true, SnapshotOnlyNoKey
		if deferrable {
			t.SnapshotOnly = SnapshotOnlyDeferrable
		}
	}
	if t.Keyless && t.Partitioned {
		what := "has no primary key"
		if deferrable {
			what = "has only a DEFERRABLE primary key, which is no replica identity"
		}
		return t, fmt.Errorf("source table %s is partitioned and %s: pgconverge replicates a table without a key by whole rows only when it is not partitioned; add a primary key (ALTER TABLE %s ADD PRIMARY KEY (...), with the partition key's columns, NOT DEFERRABLE), or leave the table out: %w",
			t, what, t.Quoted(), changebatch.ErrNoKey)
	}
	return t, t.Validate()
}

// useNotNullDomainBases gives each column whose type is a domain declared NOT NULL (itself or a
// domain it is based on) the innermost base type of that domain as its target type: the target
// table's non-key columns are NULL in tombstones (a delete carries only the key), which such a
// domain refuses. The values are the source's, which its domain admitted; the stream still
// follows the source column by its type oid. tx must have search_path pg_catalog (qualified names).
func useNotNullDomainBases(ctx context.Context, tx pgx.Tx, cols []changebatch.Column) error {
	oids := make([]uint32, len(cols))
	for i, c := range cols {
		oids[i] = c.TypeOID
	}
	rows, err := tx.Query(ctx, `with recursive chain (top, base, mod, nn, depth) as (
  select t.oid, t.typbasetype, t.typtypmod, t.typnotnull, 1 from pg_type t where t.oid = any($1) and t.typtype = 'd'
  union all
  select c.top, t.typbasetype, t.typtypmod, c.nn or t.typnotnull, c.depth + 1
  from chain c join pg_type t on t.oid = c.base where t.typtype = 'd')
select distinct on (top) top, format_type(base, mod) from chain where nn order by top, depth desc`, oids)
	if err != nil {
		return err
	}
	bases := map[uint32]string{}
	for rows.Next() {
		var oid uint32
		var base string
		if err := rows.Scan(&oid, &base); err != nil {
			rows.Close()
			return err
		}
		bases[oid] = base
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for i, c := range cols {
		if b, ok := bases[c.TypeOID]; ok && !c.Key {
			cols[i].Type = b
		}
	}
	return nil
}

// hasDeferrableKey reports whether the table's primary key is DEFERRABLE where it would be the
// replica identity (REPLICA IDENTITY DEFAULT or FULL): PostgreSQL does not take a deferrable index
// as replica identity, so with REPLICA IDENTITY DEFAULT the table has none and, once published,
// every UPDATE and DELETE on the source fails; and one statement may pass through duplicate keys
// (UPDATE t SET id = id + 1), whose changes cannot be applied key by key (PostgreSQL docs §31.1
// "Publication", and CREATE TABLE "DEFERRABLE"). Such a key is no key: keyColumns leaves it out.
func hasDeferrableKey(ctx context.Context, conn *pgx.Conn, oid uint32, ident string) (bool, error) {
	if ident == "i" {
		return false, nil // PostgreSQL accepts only an immediate index as replica identity index
	}
	var deferrable bool
	err := conn.QueryRow(ctx, `select exists (select 1 from pg_index where indrelid = $1 and indisprimary and not indimmediate)`, oid).Scan(&deferrable)
	return deferrable, err
}

// keyColumns maps the attribute numbers of the replica identity key to their 1-based position in
// its index: the index marked as replica identity for REPLICA IDENTITY USING INDEX, else the
// primary key unless it is DEFERRABLE (then there is none).
func keyColumns(ctx context.Context, conn *pgx.Conn, oid uint32, ident string) (map[int16]int, error) {
	cond := "indisprimary and indimmediate"
	if ident == "i" {
		cond = "indisreplident"
	}
	rows, err := conn.Query(ctx, `select unnest(indkey[0:indnkeyatts-1]) from pg_index where indrelid = $1 and `+cond, oid)
	if err != nil {
		return nil, err
	}
	nums, err := pgx.CollectRows(rows, pgx.RowTo[int16])
	if err != nil {
		return nil, err
	}
	keys := map[int16]int{}
	for i, n := range nums {
		keys[n] = i + 1
	}
	return keys, nil
}

// SkippedTable is a table left out of the default selection, with the reason.
type SkippedTable struct {
	Table  changebatch.TableName
	Reason string
}

// DefaultTables chooses the tables to replicate when none are named: every table of the
// publication when it exists (pg_publication_tables: the partitioned tables when it publishes via
// the partition root, else their partitions) and every table no publication can carry, which the
// daemon keeps by snapshots (UnpublishableTables); else every table CandidateTables lists. Tables
// left out are returned with the reason, in name order.
func DefaultTables(ctx context.Context, conn *pgx.Conn, publication string) ([]changebatch.TableName, []SkippedTable, error) {
	exists, err := PublicationExists(ctx, conn, publication)
	if err != nil {
		return nil, nil, err
	}
	if !exists {
		return CandidateTables(ctx, conn)
	}
	names, err := PublishedTables(ctx, conn, publication)
	if err != nil {
		return nil, nil, err
	}
	cands, err := listTables(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	var skipped []SkippedTable
	for _, c := range cands {
		switch {
		case c.skip != "" && c.unpublishable:
			skipped = append(skipped, SkippedTable{c.name, c.skip})
		case c.unpublishable && !c.partitioned && !slices.Contains(names, c.name):
			// A partitioned one is left to the publication, which may carry its partitions.
			names = append(names, c.name)
		}
	}
	slices.SortFunc(names, func(a, b changebatch.TableName) int {
		return cmp.Or(strings.Compare(a.Schema, b.Schema), strings.Compare(a.Name, b.Name))
	})
	return names, skipped, nil
}

// CandidateTables lists the source's user tables that pgconverge can carry, in name order: each a
// publication can carry (a primary key that is not DEFERRABLE, a replica identity index or
// REPLICA IDENTITY FULL), and each it keeps by snapshots instead (UNLOGGED, REPLICA IDENTITY
// NOTHING, without such a key and not FULL), where a partitioned table counts as one table and its
// partitions are left out (they are replicated through it). A partitioned table without a usable
// key is returned apart, with the reason and the fix: pgconverge follows a table without a key by
// whole rows only when it is not partitioned.
func CandidateTables(ctx context.Context, conn *pgx.Conn) ([]changebatch.TableName, []SkippedTable, error) {
	cands, err := listTables(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	var names []changebatch.TableName
	var skipped []SkippedTable
	for _, c := range cands {
		if c.skip != "" {
			skipped = append(skipped, SkippedTable{c.name, c.skip})
		} else {
			names = append(names, c.name)
		}
	}
	return names, skipped, nil
}

// candidate is a source table as listTables sees it: unpublishable when no publication can carry
// its changes, skip the reason pgconverge cannot carry it at all ("" when it can).
type candidate struct {
	name                       changebatch.TableName
	partitioned, unpublishable bool
	skip                       string
}

// listTables lists the source's user tables and partitioned tables that are not partitions, in
// name order, as candidates.
func listTables(ctx context.Context, conn *pgx.Conn) ([]candidate, error) {
	rows, err := conn.Query(ctx, `with t as (
  select n.nspname::text as schema_name, c.relname::text as table_name, c.relkind = 'p' as partitioned,
    exists (select 1 from pg_index i where i.indrelid = c.oid and case when c.relreplident = 'i' then i.indisreplident else i.indisprimary and i.indimmediate end) as keyed,
    c.relpersistence = 'u' or c.relreplident = 'n' as no_wal_or_identity, c.relreplident = 'f' as full_identity
  from pg_class c join pg_namespace n on n.oid = c.relnamespace
  where c.relkind in ('r', 'p') and not c.relispartition and c.relpersistence <> 't'
    and n.nspname not in ('pg_catalog', 'information_schema', 'pgconverge') and n.nspname not like 'pg\_%')
select schema_name, table_name, partitioned, no_wal_or_identity or not keyed and not full_identity,
  case when partitioned and not keyed then 'partitioned and without a primary key (or with a DEFERRABLE one): pgconverge follows a table without a key by whole rows only when it is not partitioned; add a primary key NOT DEFERRABLE, with the partition key''s columns (ALTER TABLE … ADD PRIMARY KEY (...))' else '' end
from t order by 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("list source tables: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
		var c candidate
		return c, r.Scan(&c.name.Schema, &c.name.Name, &c.partitioned, &c.unpublishable, &c.skip)
	})
	if err != nil {
		return nil, fmt.Errorf("list source tables: %w", err)
	}
	return out, nil
}

// PublishedTables lists the tables of publication (none when it does not exist).
func PublishedTables(ctx context.Context, conn *pgx.Conn, publication string) ([]changebatch.TableName, error) {
	rows, err := conn.Query(ctx, `select schemaname::text, tablename::text from pg_publication_tables where pubname = $1 order by 1, 2`, publication)
	if err != nil {
		return nil, fmt.Errorf("list tables of publication %q: %w", publication, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowToStructByPos[changebatch.TableName])
	if err != nil {
		return nil, fmt.Errorf("list tables of publication %q: %w", publication, err)
	}
	return names, nil
}
