-- pgconverge metadata schema, version 3: the coverage ledger (docs/design.md, "Coverage").

-- stream_segments: the continuous coverage of one slot incarnation, from start_lsn (the slot's
-- consistent point, or where the stream resumed after a break) to end_lsn. While a segment is
-- open (end_lsn NULL) it ends at its slot's progress (pgconverge.progress.applied_lsn), which
-- moves in the same target transaction as the data it covers. A segment ends when the slot was
-- dropped or invalidated (wal_status lost), or when the slot had moved past the target's progress
-- (another consumer, or a target restored from an older backup): end_reason says which, and
-- history from end_lsn to the next segment's start is a gap. publication is the publication the
-- stream last used (tables' membership tokens refer to it; NULL when not known); source identifies
-- the source database it streams from (cdc.SourceID: the cluster's system identifier and the
-- database name), so a report or a daemon pointed at another source is refused.
create table pgconverge.stream_segments (
    id                bigserial primary key,
    slot              text not null,
    slot_created_lsn  pg_lsn,
    publication       text,
    source            text,
    start_lsn         pg_lsn not null,
    end_lsn           pg_lsn,
    end_reason        text,
    started_at        timestamptz not null default now(),
    ended_at          timestamptz,
    check ((end_lsn is null) = (end_reason is null))
);
create unique index stream_segments_open on pgconverge.stream_segments (slot) where end_lsn is null;

-- table_spans: the part [start_lsn, end_lsn) of a segment during which the stream applied a
-- table's changes: from when the table was selected and published (a position read after its
-- ALTER PUBLICATION committed, never earlier) to when it left the selection or the publication or
-- the segment ended. confirmed_lsn is a source position read before the last check that found
-- the table's publication membership unchanged: a span whose membership turns out changed ends
-- there. An open span (end_lsn NULL) ends where its segment ends. generation is the target
-- table's generation (pgconverge.tables.generation) the span wrote into; membership the table's
-- publication membership token (cdc.Memberships) when the span began: the same token later means
-- the table stayed in the publication without a break since then.
create table pgconverge.table_spans (
    id             bigserial primary key,
    segment_id     bigint not null references pgconverge.stream_segments (id),
    schema_name    text not null,
    table_name     text not null,
    generation     int not null,
    membership     text,
    start_lsn      pg_lsn not null,
    confirmed_lsn  pg_lsn not null,
    end_lsn        pg_lsn,
    end_reason     text,
    started_at     timestamptz not null default now(),
    ended_at       timestamptz,
    check ((end_lsn is null) = (end_reason is null))
);
create unique index table_spans_open on pgconverge.table_spans (segment_id, schema_name, table_name) where end_lsn is null;
create index on pgconverge.table_spans (schema_name, table_name);

-- tables.generation counts the target table's incarnations: it goes up when pgconverge creates the
-- target table anew, and backfills and spans of older generations no longer count as coverage.
-- truncated_lsn is the commit LSN of the latest TRUNCATE the stream applied in this generation:
-- history before it is void, so covered.
-- target_oid is the target table's oid in this generation: a table dropped or replaced by hand
-- behind pgconverge's back is noticed, as a new generation, when its oid changed.
alter table pgconverge.tables
    add column generation int not null default 1,
    add column truncated_lsn pg_lsn,
    add column target_oid oid;
-- backfills.source identifies the source database a backfill read (cdc.SourceID): rows of another
-- source database in a target table are refused, and never count as coverage.
alter table pgconverge.backfills add column generation int not null default 1, add column source text;

-- 'gap': a backfill the daemon started because the coverage ledger showed a gap (run --on-gap).
alter table pgconverge.backfill_runs
    drop constraint backfill_runs_trigger_check,
    add constraint backfill_runs_trigger_check check (trigger in ('initial', 'manual', 'schedule', 'gap'));

-- Installations from version 2: each slot's stream has followed its loaded tables without a break
-- since their load (that is what tables.slot recorded), so each gets an open segment from the
-- earliest such load and an open span per table from its load.
insert into pgconverge.stream_segments (slot, slot_created_lsn, start_lsn)
select p.slot, p.slot_created_lsn,
       least(p.applied_lsn, (select min(t.loaded_lsn) from pgconverge.tables t where t.slot = p.slot))
from pgconverge.progress p;
insert into pgconverge.table_spans (segment_id, schema_name, table_name, generation, membership, start_lsn, confirmed_lsn)
select s.id, t.schema_name, t.table_name, t.generation, t.membership, t.loaded_lsn, p.applied_lsn
from pgconverge.tables t
join pgconverge.progress p on p.slot = t.slot
join pgconverge.stream_segments s on s.slot = p.slot and s.end_lsn is null
where t.loaded_lsn is not null;
