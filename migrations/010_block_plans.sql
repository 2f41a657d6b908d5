-- pgconverge metadata schema, version 10: backfills cut by block ranges.

-- A bulk load (a target table that holds no row and that no stream follows) is cut by ranges of
-- the source table's blocks instead of its key: its key_columns are {ctid}, and the bounds of its
-- chunks (lower_key, upper_key) hold one block number each, the chunk being blocks
-- [lower_key, upper_key) (NULL upper_key: unbounded). source_filenode is the source table's file
-- node (pg_class.relfilenode) the plan was cut from, NULL for a key plan: a block plan is resumed
-- only while the source table keeps that file, since a rewrite moves every row to other blocks.
alter table pgconverge.backfills add column source_filenode oid;
