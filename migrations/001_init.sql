-- pgconverge metadata schema, version 1: streaming progress, per-table state, backfill runs.
-- The schema itself is created by the binary before the migrator runs (tern keeps its version
-- table in it).

-- progress: the position up to which the target holds every change of the source for one slot.
-- applied_lsn is written in the same target transaction as the data it covers (docs/design.md,
-- "Exactly-once effect"); a restart resumes from it.
create table pgconverge.progress (
    slot              text primary key,
    applied_lsn       pg_lsn not null,
    slot_created_lsn  pg_lsn,
    updated_at        timestamptz not null default now()
);

-- tables: every replicated table. fence_* is the fence raised by a TRUNCATE or a completed load:
-- no version at or below it is ever written. loaded_lsn is the snapshot LSN S of the last completed initial load or backfill
-- and slot the slot whose stream has carried the table's changes without a break since then; both
-- are cleared when that no longer holds (the table left the selection, the target table was
-- dropped, its membership in the publication changed), so the table is loaded again. membership
-- identifies how the table is in the publication (cdc.Memberships); a new value means it left the
-- publication at some point, and changes in between were never streamed.
create table pgconverge.tables (
    schema_name  text not null,
    table_name   text not null,
    fence_lsn    pg_lsn not null default '0/0',
    fence_seq    bigint not null default 0,
    loaded_lsn   pg_lsn,
    loaded_at    timestamptz,
    slot         text,
    membership   text,
    primary key (schema_name, table_name)
);

-- backfills: each initial load or backfill of a table from an exact snapshot S.
create table pgconverge.backfills (
    id            bigserial primary key,
    schema_name   text not null,
    table_name    text not null,
    snapshot_lsn  pg_lsn not null,
    slot          text,
    status        text not null check (status in ('running', 'completed', 'failed')),
    rows          bigint not null default 0,
    started_at    timestamptz not null default now(),
    finished_at   timestamptz
);
create index on pgconverge.backfills (schema_name, table_name, status);
