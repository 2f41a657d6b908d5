-- pgconverge metadata schema, version 5: verify runs and the discrepancies they find
-- (docs/design.md, "Reconciliation").

-- verify_runs: one `pgconverge verify` (trigger 'manual') or one tick of run --verify-schedule
-- ('schedule'). snapshot_lsn is the exact snapshot S the source was read at; repair_lsn the fresh
-- snapshot S' repaired keys were read at (NULL without --repair).
create table pgconverge.verify_runs (
    id            bigserial primary key,
    trigger       text not null check (trigger in ('manual', 'schedule')),
    snapshot_lsn  pg_lsn,
    repair_lsn    pg_lsn,
    hash_mode     text,
    status        text not null check (status in ('running', 'completed', 'failed')),
    tables        int not null default 0,
    found         bigint not null default 0,
    repaired      bigint not null default 0,
    open          bigint not null default 0,
    error         text,
    started_at    timestamptz not null default now(),
    finished_at   timestamptz
);

-- discrepancies: each key whose target row disagreed with the source at a verified snapshot.
-- id is a pure function of the discrepancy's inputs (coverage.DiscrepancyID: the table, the key,
-- the two row hashes and the target row's version), so a replayed or repeated run over the same
-- drift finds the same id and only moves last_seen. key maps each key column to its value as
-- text; source_values and target_values map every column to its value as text (NULL with
-- --no-values, or where that side has no row). snapshot_lsn is the S of the run that first found
-- it, last_snapshot_lsn of the last. remediation says how it was closed: 'repaired' (rewritten
-- from the source at repair_lsn, in the same target transaction that set remediated_at), 'equal'
-- (a later run found the key equal) or 'superseded' (a later run found the key different in
-- another way, recorded under another id).
create table pgconverge.discrepancies (
    id                 text primary key,
    table_name         text not null,
    key                jsonb not null,
    kind               text not null check (kind in ('missing', 'extra', 'different')),
    snapshot_lsn       pg_lsn not null,
    last_snapshot_lsn  pg_lsn not null,
    source_hash        text,
    target_hash        text,
    target_lsn         pg_lsn,
    target_seq         bigint,
    target_deleted     boolean not null default false,
    source_values      jsonb,
    target_values      jsonb,
    first_run          bigint references pgconverge.verify_runs (id),
    last_run           bigint references pgconverge.verify_runs (id),
    seen               int not null default 1,
    first_seen         timestamptz not null default now(),
    last_seen          timestamptz not null default now(),
    remediated_at      timestamptz,
    remediation        text check (remediation in ('repaired', 'equal', 'superseded')),
    repair_lsn         pg_lsn,
    check ((remediated_at is null) = (remediation is null))
);
create index discrepancies_open on pgconverge.discrepancies (table_name, key) where remediated_at is null;
