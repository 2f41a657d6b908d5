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
}

// TypeDefinitions returns the definitions of the user-defined enums, domains and composite types
// that table t's columns use, directly or through arrays, domains and composite attributes, in an
// order in which they can be created (dependencies first). Domains carry their NOT NULL and CHECK
// constraints (pg_get_constraintdef), not their defaults or collations. Other user-defined types
// (ranges, base types) are not returned; the target must have them.
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
  ) n
  where d.depth < 32)
select n.nspname::text, t.typname::text, case t.typtype
  when 'e' then format('create type %I.%I as enum (%s)', n.nspname, t.typname,
    (select coalesce(string_agg(quote_literal(e.enumlabel), ', ' order by e.enumsortorder), '') from pg_enum e where e.enumtypid = t.oid))
  when 'd' then format('create domain %I.%I as %s%s%s', n.nspname, t.typname, format_type(t.typbasetype, t.typtypmod),
    case when t.typnotnull then ' not null' else '' end,
    (select coalesce(string_agg(format(' constraint %I %s', c.conname, pg_get_constraintdef(c.oid)), '' order by c.conname), '')
     from pg_constraint c where c.contypid = t.oid))
  else format('create type %I.%I as (%s)', n.nspname, t.typname,
    (select string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', ' order by a.attnum)
     from pg_attribute a where a.attrelid = t.typrelid and a.attnum > 0 and not a.attisdropped))
  end
from deps d join pg_type t on t.oid = d.oid join pg_namespace n on n.oid = t.typnamespace
where n.nspname not in ('pg_catalog', 'information_schema')
  and (t.typtype in ('e', 'd') or t.typtype = 'c' and (select relkind from pg_class where oid = t.typrelid) = 'c')
group by n.nspname, t.typname, t.oid, t.typtype, t.typbasetype, t.typtypmod, t.typnotnull, t.typrelid
order by max(d.depth) desc, 1, 2`, t.Quoted())
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (TypeDefinition, error) {
			var d TypeDefinition
			return d, r.Scan(&d.Schema, &d.Name, &d.SQL)
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read the user-defined types of source table %s: %w", t, err)
	}
	return out, nil
}
