-- pgconverge metadata schema, version 8: tables kept by snapshots only.

-- snapshot_only: why no publication can carry the table's changes (it is UNLOGGED, or has no key
-- and no REPLICA IDENTITY FULL), NULL for a streamed table. Such a table is loaded by backfills
-- alone; the coverage report calls it snapshot-only, as of its last backfill's snapshot.
alter table pgconverge.tables add column snapshot_only text;
