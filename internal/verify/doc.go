// Package verify compares the data itself: a run (Run) reads each table on the source at an exact
// snapshot S and on the target, compares checksums over key-hash groups and narrows differing
// groups down to keys (internal/reconcile), records each discrepancy once under a deterministic
// id (coverage.RecordDiscrepancies), and with Config.Repair re-reads the keys at a fresh exact
// snapshot S' and writes them through the one apply step at version (S', 0).
//
// Invariant: a target row whose version is newer than S is never reported (it has provably moved
// on), and a repair closes its discrepancy in the same target transaction that writes the row,
// so a repeated or crashed run never counts or repairs twice.
package verify
