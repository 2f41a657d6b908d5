-- pgconverge metadata schema, version 17: staging of transactions the source streams before
-- their commit (pgoutput streaming, protocol 2 and later).

-- One row per pgoutput message of a streamed transaction, in the order received (seq, per xid),
-- in protocol version 1 form (the xid that tags it in the stream is subxid). The rows of a
-- transaction are read back at its Stream Commit and applied at its commit LSN, then deleted; a
-- Stream Abort deletes them (a subtransaction's: its row changes). A daemon's session deletes its
-- slot's rows when it starts: the source streams every unconfirmed transaction again. UNLOGGED:
-- nothing in it outlives the session that wrote it, so it needs no WAL on the target.
create unlogged table pgconverge.stream_staging (
    slot text not null,
    xid bigint not null,
    seq bigint not null,
    subxid bigint not null,
    kind "char" not null,
    data bytea not null,
    primary key (slot, xid, seq)
);
