-- pgconverge metadata schema, version 18: the source's secondary indexes built on target tables
-- while they are replicated (run --copy-indexes), and the write pauses of switchovers (cutover
-- --pause-writes).

-- One row per index pgconverge built on a replicated target table: the index's name, the
-- statement it was built with, and the source index or constraint it stands for (a unique one's
-- twin is built without its uniqueness). An index of this list that the source no longer has is
-- dropped; one whose statement changed is built again; cutover --finalize deletes a table's rows.
-- An index of the target the list does not name is the operator's and never touched.
create table pgconverge.target_indexes (
    schema_name text not null,
    table_name text not null,
    index_name text not null,
    definition text not null,
    source_index text not null,
    built_at timestamptz not null default now(),
    primary key (schema_name, table_name, index_name)
);

-- A switchover's pause of the application's writes on the source (cutover --pause-writes ROLE):
-- one row per slot, written before the role's privileges are revoked, so that a cutover that
-- fails, or is killed, gives back exactly what it took (write_pause_grants). outcome is null while
-- the pause holds, then 'cut over' (the writes stay revoked: the application writes to the target
-- now) or 'given back'.
create table pgconverge.write_pauses (
    slot text primary key,
    role_name text not null,
    paused_at timestamptz not null default now(),
    ended_at timestamptz,
    outcome text check (outcome in ('cut over', 'given back'))
);

-- The role's own privileges a pause revoked, per source table (schema-qualified, quoted).
create table pgconverge.write_pause_grants (
    slot text not null references pgconverge.write_pauses on delete cascade,
    table_name text not null,
    privilege text not null,
    grantable boolean not null,
    primary key (slot, table_name, privilege)
);
