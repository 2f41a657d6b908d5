package cdc

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// TypeDefinition is the DDL that creates one user-defined type a replicated table depends on.
type TypeDefinition struct {
	Schema, Name string
	// SQL creates the type, naming every type it uses with its schema.
	SQL string
	// Labels are an enum's labels in sort order, LabelOIDs their pg_enum oids (which a RENAME
	// VALUE keeps); nil for other kinds.
	Labels    []string
	LabelOIDs []uint32
}

// TypeDefinitions returns the definitions of the user-defined enums, domains, composite types and
// range types that table t's columns use, directly or through arrays, domains, composite
// attributes, ranges and multiranges, in an order in which they can be created (dependencies
// first). Domains carry their NOT NULL and CHECK constraints (pg_get_constraintdef), not their
// defaults or collations; PostgreSQL 17 and later record a domain's NOT NULL as a named
// constraint (contype 'n'), which is carried by that name and not again as a bare NOT NULL. A range type carries its subtype, multirange type name, collation and
// subtype_diff function (which the target must have when it is not built in); a range type with a
// canonical function, and other user-defined types (base types), are not returned: the target
// must have them (CREATE TYPE, PostgreSQL docs §8.17.8).
func TypeDefinitions(ctx context.Context, conn *pgx.Conn, t changebatch.Table) ([]TypeDefinition, error) {
	var out []TypeDefinition
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// Qualify every type name whatever the session's search_path.
		if _, err := tx.Exec(ctx, `set local search_path to pg_catalog`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `with recursive deps (oid, depth) as (
  select atttypid, 0 from pg_attribute where attrelid = $1::regclass and attnum > 0 and not attisdropped
  union
  select n.dep, d.depth + 1 from deps d join pg_type t on t.oid = d.oid,
  lateral (
    select t.typelem as dep where t.typelem <> 0 and t.typsubscript = 'array_subscript_handler'::regproc
    union all select t.typbasetype where t.typtype = 'd'
    union all select a.atttypid from pg_attribute a where t.typtype = 'c' and a.attrelid = t.typrelid and a.attnum > 0 and not a.attisdropped
    union all select r.rngsubtype from pg_range r where t.typtype = 'r' and r.rngtypid = t.oid
    union all select r.rngtypid from pg_range r where t.typtype = 'm' and r.rngmultitypid = t.oid
  ) n
  where d.depth < 32)
select n.nspname::text, t.typname::text, case t.typtype
  when 'e' then format('create type %I.%I as enum (%s)', n.nspname, t.typname,
    (select coalesce(string_agg(quote_literal(e.enumlabel), ', ' order by e.enumsortorder), '') from pg_enum e where e.enumtypid = t.oid))
  when 'd' then format('create domain %I.%I as %s%s%s', n.nspname, t.typname, format_type(t.typbasetype, t.typtypmod),
    case when t.typnotnull and not exists (select 1 from pg_constraint c where c.contypid = t.oid and c.contype = 'n')
      then ' not null' else '' end,
    (select coalesce(string_agg(format(' constraint %I %s', c.conname, pg_get_constraintdef(c.oid)), '' order by c.conname), '')
     from pg_constraint c where c.contypid = t.oid))
  when 'r' then (select format('create type %I.%I as range (subtype = %s, multirange_type_name = %s%s%s)', n.nspname, t.typname,
      format_type(r.rngsubtype, null), format_type(r.rngmultitypid, null),
      case when r.rngsubdiff <> 0 then ', subtype_diff = ' || r.rngsubdiff::regproc::text else '' end,
      case when r.rngcollation <> 0 and r.rngcollation <> st.typcollation then ', collation = ' || r.rngcollation::regcollation::text else '' end)
    from pg_range r join pg_type st on st.oid = r.rngsubtype where r.rngtypid = t.oid)
  else format('create type %I.%I as (%s)', n.nspname, t.typname,
    (select string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', ' order by a.attnum)
     from pg_attribute a where a.attrelid = t.typrelid and a.attnum > 0 and not a.attisdropped))
  end,
  case when t.typtype = 'e' then array(select e.enumlabel::text from pg_enum e where e.enumtypid = t.oid order by e.enumsortorder) end,
  case when t.typtype = 'e' then array(select e.oid from pg_enum e where e.enumtypid = t.oid order by e.enumsortorder) end
from deps d join pg_type t on t.oid = d.oid join pg_namespace n on n.oid = t.typnamespace
where n.nspname not in ('pg_catalog', 'information_schema')
  and (t.typtype in ('e', 'd') or t.typtype = 'c' and (select relkind from pg_class where oid = t.typrelid) = 'c'
    or t.typtype = 'r' and (select rngcanonical from pg_range where rngtypid = t.oid) = 0)
group by n.nspname, t.typname, t.oid, t.typtype, t.typbasetype, t.typtypmod, t.typnotnull, t.typrelid
order by max(d.depth) desc, 1, 2`, t.Quoted())
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (TypeDefinition, error) {
			var d TypeDefinition
			return d, r.Scan(&d.Schema, &d.Name, &d.SQL, &d.Labels, &d.LabelOIDs)
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read the user-defined types of source table %s: %w", t, err)
	}
	return out, nil
}

// EnumLabels returns the labels, in sort order, of each enum named in names (quoted, schema
// qualified, as TypeDefinition names them); an enum that no longer exists has none.
func EnumLabels(ctx context.Context, conn *pgx.Conn, names []string) (map[string][]string, error) {
	rows, err := conn.Query(ctx, `select n, coalesce((select array_agg(e.enumlabel::text order by e.enumsortorder)
  from pg_enum e where e.enumtypid = to_regtype(n)), '{}') from unnest($1::text[]) n`, names)
	if err != nil {
		return nil, fmt.Errorf("read enum labels on the source: %w", err)
	}
	out := map[string][]string{}
	for rows.Next() {
		var n string
		var labels []string
		if err := rows.Scan(&n, &labels); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read enum labels on the source: %w", err)
		}
		out[n] = labels
	}
	rows.Close()
	return out, rows.Err()
}
