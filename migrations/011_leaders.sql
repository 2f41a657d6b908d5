-- pgconverge metadata schema, version 11: one leading daemon per slot.

-- leaders: per slot, the epoch of its current leader (apply.Lead), raised by each daemon that
-- takes the slot's leader lock (a session advisory lock on the target), with who holds it (host
-- and process) and since when, and its settings (the publication and the tables it selects): a
-- standby with other settings refuses to wait. Every transaction a leader writes the slot's progress or rows in
-- locks its row FOR SHARE and compares the epoch with its own (apply.CheckLeaderTx), so a daemon
-- that lost the lock can never commit after a new leader raised the epoch.
create table pgconverge.leaders (
    slot        text primary key,
    epoch       bigint not null,
    holder      text not null,
    settings    text not null default '',
    acquired_at timestamptz not null default now()
);
