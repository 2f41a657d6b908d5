-- pgconverge metadata schema, version 2: backfill runs and their chunks.

-- backfill_runs: one backfill of one or more tables, started by the daemon's initial load
-- ('initial'), by `pgconverge backfill` ('manual') or by --backfill-schedule ('schedule').
-- A backfill interrupted by a crash or SIGTERM is resumed by the next run of the same table, which
-- adopts it: its completed chunks stay, the rest are read from the new run's snapshot.
-- reread_rows counts the rows of chunks that an interrupted run had started and this one read
-- again.
create table pgconverge.backfill_runs (
    id           bigserial primary key,
    trigger      text not null check (trigger in ('initial', 'manual', 'schedule')),
    slot         text,
    status       text not null check (status in ('running', 'completed', 'failed')),
    workers      int not null,
    chunk_rows   bigint not null,
    rows         bigint not null default 0,
    reread_rows  bigint not null default 0,
    error        text,
    started_at   timestamptz not null default now(),
    finished_at  timestamptz
);

-- backfills (version 1) gets its run (the last run that worked on it) and the key columns it was
-- chunked by. snapshot_lsn stays the S of its first run; a table counts as backfilled at the
-- smallest S of its chunks.
alter table pgconverge.backfills
    add column run_id bigint references pgconverge.backfill_runs (id),
    add column key_columns text[];

-- backfill_chunks: the key ranges (lower_key, upper_key] of a table's backfill, in the source
-- key's own order (NULL bound = unbounded), recorded in key order as they are planned; the chunk
-- with a NULL upper_key is the last, so planning is complete once it exists. snapshot_lsn is the
-- S the chunk was read at, set when it completed; a chunk without it is read again on resume.
-- attempts counts the runs that started reading it.
create table pgconverge.backfill_chunks (
    backfill_id   bigint not null references pgconverge.backfills (id) on delete cascade,
    chunk         int not null,
    lower_key     text[],
    upper_key     text[],
    snapshot_lsn  pg_lsn,
    rows          bigint,
    attempts      int not null default 0,
    completed_at  timestamptz,
    primary key (backfill_id, chunk)
);
