// Package backfill reads tables from exact snapshots of the source and emits their rows as change
// batches stamped with the snapshot's version (S, 0).
//
// Invariant: S is the consistent point of a logical slot created with an exported snapshot, never
// pg_current_wal_lsn() read next to a snapshot: the exported snapshot shows exactly the
// transactions that committed before S (docs/design.md, "Exact snapshots"; PostgreSQL docs §55.4,
// CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT, and §9.27.5 "Snapshot Synchronization Functions").
package backfill
