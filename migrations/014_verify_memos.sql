-- pgconverge metadata schema, version 14: what verify found equal, for the next verify to skip
-- what has provably not changed since (docs/verify.md, "Incremental verify").

-- verify_memos: per table, the last verify's key-hash groups (the key hash's low `bits` bits)
-- that held rows, with each group's rows on the source at its snapshot S, its tuples on the target
-- (tombstones included) and whether it was found equal (with no target row newer than S), and the xmin of the source's snapshot S and of the target's snapshot.
-- identity names both clusters (system identifier, timeline), the tables' oids and their columns'
-- types; shape the hash expressions and relations compared: a memo whose identity or shape differs
-- from the next run's is not used. A repair of the table deletes its memo.
create table pgconverge.verify_memos (
    table_name           text primary key,
    run_id               bigint not null,
    snapshot_lsn         pg_lsn not null,
    identity             text not null,
    shape                text not null,
    bits                 int not null,
    source_xmin          xid8 not null,
    target_xmin          xid8 not null,
    source_rows          bigint not null,
    target_tuples        bigint not null,
    group_ids            int8[] not null,
    group_source_rows    int8[] not null,
    group_target_tuples  int8[] not null,
    group_equal          bool[] not null,
    updated_at           timestamptz not null default now()
);
