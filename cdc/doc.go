// Package cdc reads changes from a source PostgreSQL with logical replication: it checks the
// source, manages the publication and the slot, decodes pgoutput (protocol version 1, text
// values) and assembles whole transactions into change batches (package changebatch).
//
// Invariant: the flush position reported to the server never exceeds what the consumer's ApplyFunc
// returned as committed, nor the consumer's ConfirmLimit (a position its catalog checks vouch
// for), so the slot never releases WAL the target does not hold nor claims a change without row
// events the target does not reflect; every change gets the version (commit LSN of its
// transaction, ordinal 1..n in it). A Relation message that disagrees with a table's description
// (columns, types, key columns) ends the stream before its transaction is applied.
//
// PostgreSQL docs: §55.4 "Streaming Replication Protocol" (START_REPLICATION, CREATE_REPLICATION_SLOT,
// Primary keepalive, Standby status update), §55.5 "Logical Replication Message Formats",
// §31 "Logical Replication" (publications, replica identity).
//
// pgoutput carries no sequence changes (PostgreSQL 15): TableSequences and ReadSequence read the
// sequences a table uses from the source's catalog and sequence relations instead.
package cdc
