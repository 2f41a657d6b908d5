// Package engine is the daemon (Run) and its sessions: the checks and preparation of a session's
// start, its initial loads, gap and scheduled backfills (run by internal/backfillrun), streaming,
// the catalog checks, the slot's leadership, and the schedules that backfill and verify (with
// internal/verify) while it streams (internal/schedule). The CLI (cmd/pgconverge) turns flags
// into a Config; it provides the logger, a Monitor for metrics and a Progress for long work. The
// operator's other commands live in internal/operator.
//
// Invariant: data flows one way, producer (cdc.Streamer, backfill.ReadChunk) → change batch →
// apply.Tx → target commit (data, progress LSN and ledger rows together) → only then the slot is
// told the position (docs/design.md, "Exactly-once effect"; docs/architecture.md shows the path).
// A session's goroutines run under one errgroup and return typed errors; what the daemon does
// after a failure (stop, back off, restart at once) is decided in one place
// (disposition.Decide) from the marks errors carry from where they are born and SQLSTATE codes,
// never from message text.
package engine
