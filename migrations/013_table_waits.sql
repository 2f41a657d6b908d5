-- pgconverge metadata schema, version 13: one daemon per table, tables kept by snapshots only
-- included, and what a daemon waiting for a table waits for.

-- tables: kept_by is the slot whose daemon keeps a snapshot-only table (loads it and backfills it
-- again at each --snapshot-schedule tick), claimed under the lock of coverage.LockFollowing as a
-- streamed table is claimed by its open span; NULL for a streamed table, or one no daemon keeps.
alter table pgconverge.tables add column kept_by text;

-- table_waits: per slot, the selected tables its daemon leaves to the running daemon of another
-- slot (followed_by) and waits for, since when (engine: overlap.go). Rows of a slot are replaced
-- at each of its sessions' starts; a report shows those of slots a daemon of which runs.
create table pgconverge.table_waits (
    slot        text not null,
    schema_name text not null,
    table_name  text not null,
    followed_by text not null,
    since       timestamptz not null default now(),
    primary key (slot, schema_name, table_name)
);
