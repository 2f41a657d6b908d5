package cdc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// CheckSource reports every reason the source cannot be streamed from, joined: wal_level is not
// logical, the role may not replicate, no replication slot is free. Each error names the setting
// and the fix.
func CheckSource(ctx context.Context, conn *pgx.Conn) error {
	var walLevel, role string
	var canReplicate bool
	var maxSlots int
	err := conn.QueryRow(ctx, `select current_setting('wal_level'), current_user::text,
  (select rolreplication or rolsuper from pg_roles where rolname = current_user),
  current_setting('max_replication_slots')::int`).Scan(&walLevel, &role, &canReplicate, &maxSlots)
	if err != nil {
		return fmt.Errorf("read source settings: %w", err)
	}
	var errs []error
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
	if err := checkImmediateKey(ctx, conn, t, oid, ident); err != nil {
		return t, err
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
	// REPLICA IDENTITY FULL without a primary key: pgoutput sends whole old rows, which identify
	// the row by its value. A table kept by snapshots alone is identified alike when it has no key.
	t.Keyless = len(keys) == 0 && (ident == "f" || t.SnapshotOnly != "")
	if len(keys) == 0 && !t.Keyless && !t.Partitioned {
		t.Keyless, t.SnapshotOnly = true, SnapshotOnlyNoKey
	}
	if t.Keyless && t.Partitioned {
		return t, fmt.Errorf("source table %s is partitioned and has no primary key: pgconverge replicates a table without a key by whole rows only when it is not partitioned; add a primary key (ALTER TABLE %s ADD PRIMARY KEY (...), with the partition key's columns), or leave the table out: %w",
			t, t.Quoted(), changebatch.ErrNoKey)
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

// checkImmediateKey refuses a table whose key would be a DEFERRABLE primary key (the replica
// identity of REPLICA IDENTITY DEFAULT or FULL): PostgreSQL does not take a deferrable index as
// replica identity, so with REPLICA IDENTITY DEFAULT the table has none and, once published, every
// UPDATE and DELETE on the source fails; and one statement may pass through duplicate keys
// (UPDATE t SET id = id + 1), whose changes cannot be applied key by key (PostgreSQL docs §31.1
// "Publication", and CREATE TABLE "DEFERRABLE").
func checkImmediateKey(ctx context.Context, conn *pgx.Conn, t changebatch.Table, oid uint32, ident string) error {
	if ident == "i" {
		return nil // PostgreSQL accepts only an immediate index as replica identity index
	}
	var constraint string
	var cols []string
	err := conn.QueryRow(ctx, `select coalesce((select conname::text from pg_constraint where conindid = i.indexrelid and conrelid = i.indrelid), ''),
  array(select quote_ident(attname) from unnest(i.indkey[0:i.indnkeyatts-1]) with ordinality k(n, o)
    join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.n order by k.o)
from pg_index i where i.indrelid = $1 and i.indisprimary and not i.indimmediate`, oid).Scan(&constraint, &cols)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read key of source table %s: %w", t, err)
	}
	return fmt.Errorf("source table %s has a DEFERRABLE primary key (%s), which PostgreSQL cannot use as replica identity (a published table without one fails every UPDATE and DELETE on the source) and which lets one statement pass through duplicate keys: create it again NOT DEFERRABLE (ALTER TABLE %s DROP CONSTRAINT %s, ADD PRIMARY KEY (%s)), or add a unique index on NOT NULL columns that is not deferrable and run ALTER TABLE %s REPLICA IDENTITY USING INDEX <index>, or leave the table out: %w",
		t, constraint, t.Quoted(), pgx.Identifier{constraint}.Sanitize(), strings.Join(cols, ", "), t.Quoted(), changebatch.ErrNoKey)
}

// keyColumns maps the attribute numbers of the replica identity key to their 1-based position in
// its index: the index marked as replica identity for REPLICA IDENTITY USING INDEX, else the
// primary key.
func keyColumns(ctx context.Context, conn *pgx.Conn, oid uint32, ident string) (map[int16]int, error) {
	cond := "indisprimary"
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
// the partition root, else their partitions), else every user table that has a primary key (not DEFERRABLE), a
// replica identity index or REPLICA IDENTITY FULL, where a partitioned table counts as one table and its partitions are
// left out (they are replicated through it). Tables left out are returned with the reason.
func DefaultTables(ctx context.Context, conn *pgx.Conn, publication string) ([]changebatch.TableName, []SkippedTable, error) {
	exists, err := publicationExists(ctx, conn, publication)
	if err != nil {
		return nil, nil, err
	}
	if exists {
		names, err := PublishedTables(ctx, conn, publication)
		return names, nil, err
	}
	return CandidateTables(ctx, conn)
}

// CandidateTables lists the source's user tables that a publication can carry: each that has a
// primary key (not DEFERRABLE), a replica identity index or REPLICA IDENTITY FULL, where a
// partitioned table counts as one table and its partitions are left out (they are replicated
// through it); the other tables are returned with the reason and the fix.
func CandidateTables(ctx context.Context, conn *pgx.Conn) ([]changebatch.TableName, []SkippedTable, error) {
	rows, err := conn.Query(ctx, `select n.nspname::text, c.relname::text,
  case when c.relpersistence = 'u' then 'UNLOGGED: PostgreSQL writes no WAL for it, so no publication can carry its changes (ALTER TABLE … SET LOGGED replicates it; named with --tables it is kept by snapshots)'
    when c.relreplident = 'n' then 'REPLICA IDENTITY NOTHING (ALTER TABLE … REPLICA IDENTITY DEFAULT replicates it; named with --tables it is kept by snapshots)'
    when exists (select 1 from pg_index i where i.indrelid = c.oid and i.indisreplident and c.relreplident = 'i') then ''
    when exists (select 1 from pg_index i where i.indrelid = c.oid and i.indisprimary and not i.indimmediate)
      then 'its primary key is DEFERRABLE, which PostgreSQL cannot use as replica identity: make it NOT DEFERRABLE to replicate the table'
    when exists (select 1 from pg_index i where i.indrelid = c.oid and i.indisprimary) then ''
    when c.relreplident = 'f' then ''
    else 'no primary key or replica identity index, and REPLICA IDENTITY is not FULL (ALTER TABLE … ADD PRIMARY KEY, or REPLICA IDENTITY FULL, replicates it; named with --tables it is kept by snapshots)' end
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind in ('r', 'p') and not c.relispartition and c.relpersistence <> 't' and n.nspname not in ('pg_catalog', 'information_schema', 'pgconverge')
  and n.nspname not like 'pg\_%'
order by 1, 2`)
	if err != nil {
		return nil, nil, fmt.Errorf("list source tables: %w", err)
	}
	defer rows.Close()
	var names []changebatch.TableName
	var skipped []SkippedTable
	for rows.Next() {
		var n changebatch.TableName
		var unkeyed string
		if err := rows.Scan(&n.Schema, &n.Name, &unkeyed); err != nil {
			return nil, nil, fmt.Errorf("list source tables: %w", err)
		}
		if unkeyed == "" {
			names = append(names, n)
		} else {
			skipped = append(skipped, SkippedTable{n, unkeyed})
		}
	}
	return names, skipped, rows.Err()
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
