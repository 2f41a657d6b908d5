// Package changebatch is the one vocabulary shared by the producers of changes (cdc, backfill) and
// their consumer (apply): an Arrow record batch of row changes for one table.
//
// Invariant: every row carries its version (LSN, seq) and its operation, and a batch's rows are in
// the order the producer saw them; the consumer never needs anything but the batch to apply it.
//
// Shape of a batch for a table with columns c1..cn:
//
//	c1..cn          utf8, nullable  the column's value in PostgreSQL text format (NULL = SQL NULL)
//	_cdc_lsn        uint64          commit LSN of the source transaction, or the snapshot LSN S
//	_cdc_seq        uint64          ordinal of the change in its transaction (1..n); 0 for snapshot rows
//	_cdc_op         uint8           'U' upsert, 'D' delete (tombstone), 'T' truncate (fence)
//	_cdc_unchanged  list<utf8>      names of columns whose value the source did not send
//	                                (pgoutput 'u', an unchanged TOASTed value); NULL when none
//
// A keyless table's batches (Table.Keyless, metadata "pgconverge.keyless" = "true") have one more
// column:
//
//	_cdc_occurrence uint64          for a snapshot row, the row's place in the snapshot
//	                                (its ctid as block<<16 | offset); 0 for a streamed change
//
// and carry whole rows: a 'D' is the deleted row's old value, and an UPDATE is a 'D' of the old
// value followed by a 'U' of the new one, at the same version.
//
// An UPDATE that changes the key is two consecutive rows with the same version: 'D' for the old key,
// then 'U' for the new key; that upsert's unchanged columns refer to the old key's row.
//
// The schema's metadata names the table (keys "pgconverge.schema", "pgconverge.table"); each data
// field's metadata gives its SQL type ("pgconverge.type", from format_type) and whether it is part
// of the replica identity key ("pgconverge.key" = "true").
//
// Versions follow the version rule of docs/design.md: a streamed change is (commit LSN, ordinal
// 1..n), a snapshot row is (S, 0); versions compare lexicographically. See PostgreSQL docs §55.5
// "Logical Replication Message Formats" for where the values come from.
//
// TableName is the one name of a table across the project (cdc, backfill, apply, coverage and the
// engine use it; Table, a description with columns, embeds it); ParseTableName and ParseTableList
// read it as SQL does.
package changebatch
