package apply

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// LiveViewName returns the name of the live view of target table t: the same table name in the
// schema named t's schema plus suffix (public.orders, "_live": public_live.orders).
func LiveViewName(t changebatch.TableName, suffix string) changebatch.TableName {
	return changebatch.TableName{Schema: t.Schema + suffix, Name: t.Name}
}

// liveViewSQL returns the query of target table t's live view: the source's columns (generated
// ones included, in the source's order: by attnum, without the metadata columns) of the rows that
// are not tombstones, nor copies a delete took in a table without a key: NOT _cdc_deleted. Rows whose values the stream left unknown (_cdc_unknown) are live,
// with those values NULL until they are read again.
func liveViewSQL(t changebatch.Table) string {
	type col struct {
		name   string
		attnum int16
	}
	var all []col
	for _, c := range t.Columns {
		all = append(all, col{c.Name, c.Attnum})
	}
	for _, g := range t.Generated {
		all = append(all, col{g.Name, g.Attnum})
	}
	slices.SortStableFunc(all, func(a, b col) int { return cmp.Compare(a.attnum, b.attnum) })
	var cols []string
	for _, c := range all {
		cols = append(cols, pgx.Identifier{c.name}.Sanitize())
	}
	return "select " + strings.Join(cols, ", ") + " from " + t.Quoted() + " where not " + qDeleted
}

// EnsureLiveView creates or replaces the live view of target table t (LiveViewName, liveViewSQL)
// and its schema, in one transaction: a query of it sees the table as the source holds it (as of
// the target's progress), without tombstones and metadata columns. A view whose columns changed
// (the source dropped or renamed one) is dropped and created again; when other objects depend on
// it, it is left as it was and the error says which view to change (SQLSTATE 2BP01 wrapped).
func EnsureLiveView(ctx context.Context, conn *pgx.Conn, t changebatch.Table, suffix string) error {
	v := LiveViewName(t.TableName, suffix)
	create := "create or replace view " + v.Quoted() + " as " + liveViewSQL(t)
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var existed bool
		if err := tx.QueryRow(ctx, `select to_regnamespace($1) is not null`, pgx.Identifier{v.Schema}.Sanitize()).Scan(&existed); err != nil {
			return fmt.Errorf("look up schema %q of the live views: %w", v.Schema, err)
		}
		if !existed {
			if _, err := tx.Exec(ctx, "create schema "+pgx.Identifier{v.Schema}.Sanitize()); err != nil {
				return fmt.Errorf("create schema %q of the live views (the target role needs CREATE on the database): %w", v.Schema, err)
			}
			if _, err := tx.Exec(ctx, "comment on schema "+pgx.Identifier{v.Schema}.Sanitize()+" is "+changebatch.QuoteLiteral(liveSchemaComment)); err != nil {
				return fmt.Errorf("comment on schema %q: %w", v.Schema, err)
			}
		}
		if _, err := tx.Exec(ctx, "savepoint replace_view"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, create)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InvalidTableDefinition {
			// CREATE OR REPLACE VIEW keeps the view's columns and only adds new ones at the end.
			if _, err := tx.Exec(ctx, "rollback to savepoint replace_view"); err != nil {
				return err
			}
			if _, err = tx.Exec(ctx, "drop view "+v.Quoted()); err == nil {
				_, err = tx.Exec(ctx, create)
			}
		}
		if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.DependentObjectsStillExist {
			return fmt.Errorf("live view %s of %s keeps its old columns: other objects depend on it (%s); drop or change them, then restart the daemon: %w", v, t, pgErr.Detail, err)
		}
		if err != nil {
			return fmt.Errorf("create live view %s of %s: %w", v, t, err)
		}
		comment := liveViewComment + t.String() + ": its rows without tombstones and metadata columns, kept by pgconverge run (--live-suffix)"
		if _, err := tx.Exec(ctx, "comment on view "+v.Quoted()+" is "+changebatch.QuoteLiteral(comment)); err != nil {
			return fmt.Errorf("comment on live view %s: %w", v, err)
		}
		return nil
	})
}

// liveViewComment starts the comment of every live view (EnsureLiveView): it marks the views that
// DDL of their table may drop first (dropLiveViews), and only those.
const liveViewComment = "pgconverge live view of "

// dropLiveViews drops, in tx, the live views of target table t (views marked by liveViewComment
// that depend on it): ALTER COLUMN … TYPE and DROP TABLE refuse a table a view uses. The daemon
// creates them again once the table is in line (EnsureLiveView). A view that other objects
// depend on is not dropped: the error names them (SQLSTATE 2BP01).
func dropLiveViews(ctx context.Context, tx pgx.Tx, t changebatch.Table) error {
	rows, err := tx.Query(ctx, `select distinct v.oid::regclass::text from pg_depend d
join pg_rewrite r on r.oid = d.objid join pg_class v on v.oid = r.ev_class
where d.classid = 'pg_rewrite'::regclass and d.refclassid = 'pg_class'::regclass and d.refobjid = $1::regclass
  and v.relkind = 'v' and v.oid <> $1::regclass and starts_with(coalesce(obj_description(v.oid, 'pg_class'), ''), $2)`,
		t.Quoted(), liveViewComment)
	if err != nil {
		return fmt.Errorf("find the live views of %s: %w", t, err)
	}
	views, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("find the live views of %s: %w", t, err)
	}
	for _, v := range views {
		if _, err := tx.Exec(ctx, "drop view "+v); err != nil {
			return fmt.Errorf("drop live view %s before changing %s (it is created again after): %w", v, t, err)
		}
	}
	return nil
}

// dropEmptyLiveSchemas drops, in tx, the schemas of live views (apply.LiveViewName) of
// tables that hold nothing any more; a schema that holds anything stays.
func dropEmptyLiveSchemas(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `do $$
declare s name;
begin
  for s in select n.nspname from pg_namespace n
    where obj_description(n.oid, 'pg_namespace') = '`+liveSchemaComment+`'
      and not exists (select 1 from pg_class c where c.relnamespace = n.oid)
      and not exists (select 1 from pg_type t where t.typnamespace = n.oid)
      and not exists (select 1 from pg_proc p where p.pronamespace = n.oid) loop
    execute format('drop schema %I', s);
  end loop;
end $$`)
	if err != nil {
		return fmt.Errorf("drop the emptied schemas of live views: %w", err)
	}
	return nil
}

// liveSchemaComment marks the schemas EnsureLiveView created, which dropEmptyLiveSchemas may drop
// once empty.
const liveSchemaComment = "pgconverge live views"
