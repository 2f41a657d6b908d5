-- pgconverge metadata schema, version 7: what of the source table a backfill read.

-- source_shape: the publication's row filter and column list the backfill read the table through
-- (changebatch.Table.Shape), NULL for the whole table. An interrupted backfill is resumed only
-- with the same shape: chunks read through another filter or list hold other rows or columns.
alter table pgconverge.backfills add column source_shape text;
