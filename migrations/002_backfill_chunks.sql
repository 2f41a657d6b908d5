-- pgconverge metadata schema, version 2: backfill runs and their chunks.

-- backfill_runs: one backfill of one or more tables, started by the daemon's initial load
-- ('initial'), by `pgconverge backfill` ('manual') or by --backfill-schedule ('schedule').
-- A backfill interrupted by a crash or SIGTERM is resumed by the next run of the same table, which
-- adopts it: its completed chunks stay, the rest are read from the new run's snapshot.
-- reread_rows counts the rows of chunks that an interrupted run had started and this one read
-- again. A run stopped by a signal or a shutdown ends 'interrupted', one that hit an error 'failed'.
create table pgconverge.backfill_runs (
    id           bigserial primary key,
    trigger      text not null check (trigger in ('initial', 'manual', 'schedule')),
    slot         text,
    status       text not null check (status in ('running', 'completed', 'failed', 'interrupted')),
    workers      int not null,
    chunk_rows   bigint not null,
    rows         bigint not null default 0,
    reread_rows  bigint not null default 0,
    error        text,
    started_at   timestamptz not null default now(),
    finished_at  timestamptz
);

-- backfills (version 1) gets its run (the last run that worked on it), the key columns it was
-- chunked by and the target table's file node when it started (pg_relation_filenode): a backfill
-- is only resumed into the same table file, not after the target table was dropped, truncated or
-- rewritten. snapshot_lsn stays the S of its first run; a table counts as backfilled at the
-- smallest S of its chunks.
-- A backfill is 'abandoned' when it is never to be resumed: a newer backfill of the table started,
-- the stream stopped covering the table, or the target table was created anew.
alter table pgconverge.backfills
    add column run_id bigint references pgconverge.backfill_runs (id),
    add column key_columns text[],
    add column target_filenode oid,
    drop constraint backfills_status_check,
    add constraint backfills_status_check check (status in ('running', 'completed', 'failed', 'abandoned'));

-- backfill_chunks: the key ranges (lower_key, upper_key] of a table's backfill, in the source
-- key's own order (NULL bound = unbounded), recorded in key order as they are planned; the chunk
-- with a NULL upper_key is the last, so planning is complete once it exists. A chunk is applied in
-- one transaction, or, when its rows must be merged with rows the target holds, batch by batch:
-- then done_key is the last key applied so far and done_rows the rows applied, and a resumed
-- chunk goes on after done_key. snapshot_lsn is the smallest S any applied part of the chunk was
-- read at; completed_at is set when the whole chunk is in. attempts counts the runs that started
-- reading it.
create table pgconverge.backfill_chunks (
    backfill_id   bigint not null references pgconverge.backfills (id) on delete cascade,
    chunk         int not null,
    lower_key     text[],
    upper_key     text[],
    snapshot_lsn  pg_lsn,
    done_key      text[],
    done_rows     bigint not null default 0,
    rows          bigint,
    attempts      int not null default 0,
    completed_at  timestamptz,
    primary key (backfill_id, chunk)
);
