-- pgconverge metadata schema, version 6: the audit of suppressed replays
-- (docs/design.md, "Exactly once, audited").

-- suppressed_replays: one row per target transaction and table in which a replay had no effect:
-- the stream's apply step kept rows the target already held at the same or a newer version
-- (path 'stream', slot set), or a verify run found discrepancies already recorded under their ids
-- (path 'verify', verify_run set). first_lsn..last_lsn is the window replayed: for the stream the
-- versions' LSNs of the table's changes in that transaction, for verify the snapshot the known
-- discrepancies were first found at up to the run's snapshot. rows_offered counts what was
-- offered (changes, or discrepancies found), rows_suppressed what had no effect. target_xid is
-- the target transaction that wrote the row, and with it everything else it counts. Rows older
-- than the retention (`--audit-retention`, default 30 days) are deleted by `run` once an hour
-- and by each `verify`.
create table pgconverge.suppressed_replays (
    id               bigserial primary key,
    path             text not null check (path in ('stream', 'verify')),
    slot             text,
    verify_run       bigint,
    table_name       text not null,
    first_lsn        pg_lsn not null,
    last_lsn         pg_lsn not null,
    rows_offered     bigint not null,
    rows_suppressed  bigint not null check (rows_suppressed > 0 and rows_suppressed <= rows_offered),
    target_xid       xid8 not null default pg_current_xact_id(),
    recorded_at      timestamptz not null default now(),
    check ((path = 'stream') = (slot is not null) and (path = 'verify') = (verify_run is not null)),
    check (first_lsn <= last_lsn)
);
create index suppressed_replays_recorded on pgconverge.suppressed_replays (recorded_at);
create index suppressed_replays_table on pgconverge.suppressed_replays (table_name, first_lsn);
