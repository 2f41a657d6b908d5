-- pgconverge metadata schema, version 12: backfill runs that workers on other hosts can join
-- (`pgconverge backfill --join`).

-- backfill_runs: the run's exported snapshot (its id for SET TRANSACTION SNAPSHOT, and its LSN S),
-- importable while the run runs; the publication whose row filter and column list the run reads
-- its tables through (NULL: the run reads them as the ledger records); and, for a daemon's run,
-- the slot it leads and the leader epoch its chunks are checked against (apply.CheckLeaderTx).
alter table pgconverge.backfill_runs
    add column snapshot_name text,
    add column snapshot_lsn  pg_lsn,
    add column publication   text,
    add column leader_slot   text,
    add column leader_epoch  bigint;

-- backfill_chunks: claimed_by is the backend pid of the target session of the worker that claimed
-- the chunk (coverage.ClaimChunk, FOR UPDATE SKIP LOCKED). A claim stands while that session holds
-- the worker lock (session advisory lock ("pgcw", pid)); a chunk whose claimer's session ended is
-- claimable again.
alter table pgconverge.backfill_chunks add column claimed_by int;

-- backfill_workers: the target sessions of the processes that run a backfill run (its control
-- session and its workers') or joined one (joined), with the session's backend start (a pid alone
-- may be reused) and when the process last showed it is alive (seen_at, every 2 s). Every running
-- backfill run and every streaming daemon ends the sessions of a process silent past the lease (a
-- frozen or cut-off host), so the chunks it claimed are claimable again, the row locks of its
-- open transactions are released and a run whose process froze no longer shows as running.
create table pgconverge.backfill_workers (
    pid           int not null,
    backend_start timestamptz not null,
    run_id        bigint not null,
    joined        boolean not null,
    host          text not null,
    seen_at       timestamptz not null,
    primary key (pid, backend_start)
);
