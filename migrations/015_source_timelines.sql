-- pgconverge metadata schema, version 15: the source timeline each slot's stream follows.

-- source_timelines: per slot, the timeline of the source server its latest session streams from
-- (IDENTIFY_SYSTEM), recorded by the leader in each session start's ledger transaction. A session
-- on another timeline (a promoted standby of the source) reads the source's timeline history and
-- refuses to stream when the recorded timeline ended before the target's progress: the promoted
-- standby lacks changes the target holds (engine: checkTimeline).
create table pgconverge.source_timelines (
    slot        text primary key,
    timeline    bigint not null,
    recorded_at timestamptz not null default now()
);
