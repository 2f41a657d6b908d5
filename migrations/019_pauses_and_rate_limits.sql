-- pgconverge metadata schema, version 19: the operator's pauses of a daemon (pgconverge pause,
-- resume) and the rate limits of its backfills and verifies (run --max-rows-per-second,
-- --max-bytes-per-second; backfill --set; a settings file reloaded on SIGHUP).

-- One row per slot and part of its daemon that is paused: 'stream' (the slot is kept and read no
-- further), 'backfill' or 'verify' (their reads wait at the next batch or query). The daemon
-- follows this table every second, so a pause outlives a restart; resume deletes the row, and so
-- does the daemon when a paused stream's slot reaches 80% of its WAL budget (and logs it).
create table pgconverge.pauses (
    slot text not null,
    what text not null check (what in ('stream', 'backfill', 'verify')),
    paused_at timestamptz not null default now(),
    paused_by text not null,
    primary key (slot, what)
);

-- The rate limits of a slot's daemon: rows and bytes per second its backfills and its verifies
-- may read from the source each (0: no limit). The daemon writes its flags' values when it starts;
-- backfill --set and a SIGHUP reload replace them while it runs; set_by says which did.
create table pgconverge.rate_limits (
    slot text primary key,
    max_rows_per_second double precision not null check (max_rows_per_second >= 0),
    max_bytes_per_second double precision not null check (max_bytes_per_second >= 0),
    set_at timestamptz not null default now(),
    set_by text not null
);
