package backfillrun

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
)

// CheckTargetCreatable returns, all at once, what would make creating the metadata schema or the
// target tables of tables fail on tgt: the target role may not create the pgconverge schema, a
// missing schema or a missing table in an existing schema (CREATE on the database or the schema,
// PostgreSQL docs §5.7 "Privileges"), or a column's type exists on the source (src) but not on
// the target and is not one pgconverge creates (an extension's type, a base type:
// cdc.TypeDefinitions). An existing target table is refused when pgconverge did not make it
// (apply.IsTargetTable), and not checked further. With liveSuffix, the
// schemas of the live views (apply.LiveViewName) that are missing need CREATE on the database
// too.
func CheckTargetCreatable(ctx context.Context, src, tgt *pgx.Conn, tables []changebatch.Table, liveSuffix string) error {
	var canCreate, hasMeta bool
	err := tgt.QueryRow(ctx, `select has_database_privilege(current_database(), 'CREATE'), to_regnamespace('pgconverge') is not null`).
		Scan(&canCreate, &hasMeta)
	if err != nil {
		return fmt.Errorf("read the target role's privileges: %w", err)
	}
	role, db := pgx.Identifier{tgt.Config().User}.Sanitize(), pgx.Identifier{tgt.Config().Database}.Sanitize()
	var errs []error
	if !hasMeta && !canCreate {
		errs = append(errs, fmt.Errorf("the target role may not create pgconverge's metadata schema pgconverge: GRANT CREATE ON DATABASE %s TO %s, or create it for the role: CREATE SCHEMA pgconverge AUTHORIZATION %s", db, role, role))
	}
	if liveSuffix != "" && !canCreate {
		seen := map[string]bool{}
		for _, t := range tables {
			v := apply.LiveViewName(t.TableName, liveSuffix)
			if seen[v.Schema] {
				continue
			}
			seen[v.Schema] = true
			var exists bool
			if err := tgt.QueryRow(ctx, `select to_regnamespace($1) is not null`, pgx.Identifier{v.Schema}.Sanitize()).Scan(&exists); err != nil {
				return fmt.Errorf("look up schema %s on the target: %w", v.Schema, err)
			}
			if !exists {
				errs = append(errs, fmt.Errorf("the target role may not create schema %s for the live views: GRANT CREATE ON DATABASE %s TO %s, create the schema for the role, or pass --live-suffix ''",
					pgx.Identifier{v.Schema}.Sanitize(), db, role))
			}
		}
	}
	for _, t := range tables {
		var exists, schemaExists, canCreateIn bool
		err := tgt.QueryRow(ctx, `select to_regclass($1) is not null, n.oid is not null, coalesce(has_schema_privilege(n.oid, 'CREATE'), false)
from (select 1) one left join pg_namespace n on n.nspname = $2`, t.Quoted(), t.Schema).Scan(&exists, &schemaExists, &canCreateIn)
		if err != nil {
			return fmt.Errorf("look up target table %s: %w", t, err)
		}
		if exists {
			if ours, err := apply.IsTargetTable(ctx, tgt, t.TableName); err != nil {
				return err
			} else if !ours {
				errs = append(errs, apply.NotTargetTableError(t.TableName))
			}
			continue
		}
		switch {
		case schemaExists && !canCreateIn:
			errs = append(errs, fmt.Errorf("the target role may not create table %s: it needs CREATE on schema %s: GRANT CREATE ON SCHEMA %s TO %s",
				t, pgx.Identifier{t.Schema}.Sanitize(), pgx.Identifier{t.Schema}.Sanitize(), role))
		case !schemaExists && !canCreate:
			errs = append(errs, fmt.Errorf("the target role may not create schema %s for table %s: GRANT CREATE ON DATABASE %s TO %s, or create the schema on the target first",
				pgx.Identifier{t.Schema}.Sanitize(), t, db, role))
		}
		missing, err := missingTypes(ctx, src, tgt, t)
		if err != nil {
			return err
		}
		errs = append(errs, missing...)
	}
	return errors.Join(errs...)
}

// missingTypes returns one error per type a column of t uses (itself, as an array's element, or
// as a multirange's range, which comes with it)
// that the target lacks and pgconverge does not create (cdc.TypeDefinitions), naming the
// extension that provides it on the source, if any.
func missingTypes(ctx context.Context, src, tgt *pgx.Conn, t changebatch.Table) ([]error, error) {
	defs, err := cdc.TypeDefinitions(ctx, src, t)
	if err != nil {
		return nil, err
	}
	created := map[[2]string]bool{}
	for _, d := range defs {
		created[[2]string{d.Schema, d.Name}] = true
	}
	var oids []uint32
	for _, c := range t.Columns {
		oids = append(oids, c.TypeOID)
	}
	rows, err := src.Query(ctx, `select distinct n.nspname::text, e.typname::text,
  (select x.extname::text from pg_depend d join pg_extension x on x.oid = d.refobjid
    where d.classid = 'pg_type'::regclass and d.objid = e.oid and d.deptype = 'e')
from pg_type t join pg_type e on e.oid = coalesce(
  (select r.rngtypid from pg_range r where r.rngmultitypid = case when t.typcategory = 'A' and t.typelem <> 0 then t.typelem else t.oid end),
  case when t.typcategory = 'A' and t.typelem <> 0 then t.typelem else t.oid end)
join pg_namespace n on n.oid = e.typnamespace
where t.oid = any($1) and n.nspname not in ('pg_catalog', 'information_schema')`, oids)
	if err != nil {
		return nil, fmt.Errorf("read the types of source table %s: %w", t, err)
	}
	type typeName struct {
		Schema, Name string
		Extension    *string
	}
	used, err := pgx.CollectRows(rows, pgx.RowToStructByPos[typeName])
	if err != nil {
		return nil, fmt.Errorf("read the types of source table %s: %w", t, err)
	}
	var errs []error
	for _, u := range used {
		if created[[2]string{u.Schema, u.Name}] {
			continue
		}
		var exists bool
		if err := tgt.QueryRow(ctx, `select to_regtype($1) is not null`, pgx.Identifier{u.Schema, u.Name}.Sanitize()).Scan(&exists); err != nil {
			return nil, fmt.Errorf("look up type %s on the target: %w", changebatch.QualifiedName(u.Schema, u.Name), err)
		}
		if exists {
			continue
		}
		fix := "create it on the target as on the source"
		if u.Extension != nil {
			fix = fmt.Sprintf("it comes from extension %s on the source: CREATE EXTENSION %s on the target (in schema %s)",
				*u.Extension, pgx.Identifier{*u.Extension}.Sanitize(), pgx.Identifier{u.Schema}.Sanitize())
		}
		errs = append(errs, fmt.Errorf("table %s uses type %s, which the target lacks: %s", t, changebatch.QualifiedName(u.Schema, u.Name), fix))
	}
	return errs, nil
}
