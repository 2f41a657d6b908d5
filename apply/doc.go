// Package apply is the one version-guarded write path into the target: streamed transactions and
// snapshot rows both go through Tx.Apply.
//
// Invariant: apply never lowers a row's version, never writes a version at or below the table's
// TRUNCATE fence, and commits data, the progress LSN and ledger rows in one target transaction
// (DESIGN.md, "The version rule" and "Exactly-once effect").
//
// A batch is staged with COPY (text format, PostgreSQL docs §COPY "Text Format") into a temporary
// table and merged with one INSERT … ON CONFLICT … DO UPDATE … WHERE (old version) < (new version)
// (PostgreSQL docs, INSERT "ON CONFLICT Clause"). Several changes of one key in a batch are first
// collapsed to the newest, keeping earlier values for columns the newest left unchanged.
//
// SyncSequence creates a missing target sequence and moves it forward to a source sequence's
// value, never back.
package apply
