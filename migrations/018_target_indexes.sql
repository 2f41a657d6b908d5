-- pgconverge metadata schema, version 18: the source's secondary indexes built on target tables
-- while they are replicated (run --copy-indexes).

-- One row per index pgconverge built on a replicated target table: the index's name, the
-- statement it was built with, and the source index or constraint it stands for (a unique one's
-- twin is built without its uniqueness). An index of this list that the source no longer has is
-- dropped; one whose statement changed is built again; cutover --finalize deletes a table's rows.
-- An index of the target the list does not name is the operator's and never touched.
create table pgconverge.target_indexes (
    schema_name text not null,
    table_name text not null,
    index_name text not null,
    definition text not null,
    source_index text not null,
    built_at timestamptz not null default now(),
    primary key (schema_name, table_name, index_name)
);
