-- Schema changes of source tables (issue 5). A column added to a target table, or changed to
-- another type, leaves its existing rows without the source's values (ADD COLUMN ... DEFAULT and
-- ALTER COLUMN TYPE rewrite rows without logical changes): schema_changed_lsn is a source
-- position read after the change was seen, and a backfill chunk read at an S at or below it no
-- longer counts as coverage, so the table is loaded again.
alter table pgconverge.tables add column schema_changed_lsn pg_lsn;


-- source_shape: the source table's relfilenode and its columns' attnums, types and generation
-- expressions, as last streamed against (JSON, apply.sourceShape). A rewrite, or a column created
-- again under the same name, changes values without a logical change: the table is loaded again.
alter table pgconverge.tables add column source_shape jsonb;

-- enum_labels: per enum (quoted, schema-qualified name) the source's labels with their pg_enum
-- oids, in sort order, as last synced to the target (apply.EnumLabel). An oid keeps its label's
-- identity across ALTER TYPE ... RENAME VALUE, so renamed or swapped labels are renamed alike.
create table pgconverge.enum_labels (
  type_name text primary key,
  labels jsonb not null
);
