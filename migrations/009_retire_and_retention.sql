-- pgconverge metadata schema, version 9: tables retired on purpose, loads for schema changes,
-- tombstone retention, cutovers.

-- retired_at: when `pgconverge retire` recorded that no stream is to follow the table any more
-- (its target copy stays as of its last watermark); NULL for a table meant to be followed. The
-- coverage report calls a table no stream follows 'retired' when it is set, else 'not-streamed',
-- which counts as a gap. A run that selects the table again clears it and loads the table again.
-- retired_reason says why: 'pgconverge retire', or what the daemon saw (the source table was
-- dropped, or attached as a partition of a table it follows).
alter table pgconverge.tables add column retired_at timestamptz, add column retired_reason text;

-- 'schema-change': a daemon's load of tables whose source table changed in a way no streamed
-- change shows (a column added or retyped, a rewrite), so that their rows are read again.
alter table pgconverge.backfill_runs
    drop constraint backfill_runs_trigger_check,
    add constraint backfill_runs_trigger_check check (trigger in ('initial', 'manual', 'schedule', 'gap', 'schema-change'));

-- tombstone_horizons: per table, a position below which no path can deliver a change any more
-- (the least progress of the slots whose streams follow the table), recorded at each tombstone
-- pruning round of the daemon. Tombstones at or below the newest horizon recorded at least
-- `run --tombstone-retention` ago are removed, after the table's fence is raised to it.
create table pgconverge.tombstone_horizons (
    schema_name  text not null,
    table_name   text not null,
    horizon_lsn  pg_lsn not null,
    recorded_at  timestamptz not null default now(),
    primary key (schema_name, table_name, recorded_at)
);

-- cutovers: per slot, the cutover (`pgconverge cutover`) that ended its replication: the source
-- position the stream had applied when it stopped (cut_lsn), the exact snapshot verify compared at,
-- and when each optional last step was done. A cutover run again after a crash skips what is done.
create table pgconverge.cutovers (
    slot             text primary key,
    cut_lsn          pg_lsn not null,
    verified_lsn     pg_lsn,
    tables           text[] not null,
    cut_at           timestamptz not null default now(),
    slot_dropped_at  timestamptz,
    finalized_at     timestamptz
);
