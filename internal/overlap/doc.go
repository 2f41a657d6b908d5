// Package overlap keeps the rule that one table is followed by one daemon: a session takes no
// table that a running daemon of another slot follows, and leaves it to that daemon until it
// stops.
//
// Two daemons with different slots whose selections share a table would each record the table's
// publication membership under their own publication, find the other's token at each start, and
// load the table again, over and over; two that both keep a snapshot-only table would back it up
// twice. So a session takes no table that a running daemon of another slot follows (its slot has
// an open span of the table, or keeps it by snapshots: pgconverge.tables.kept_by, and one of its
// daemons holds the slot's running lock, an advisory lock on the target that a daemon holds for as
// long as its process runs: HoldPresence). After leading its slot, a session leaves those tables
// to that daemon (Settle): it does not publish, create, load, stream or back them up (its stream
// skips the changes of a published table it does not select), records what it waits for
// (coverage.RecordWaits, for status and coverage), and follows its other tables; one whose every
// table is followed elsewhere writes nothing for its stream and waits. While streaming it looks
// every Poll whether the other daemon still runs (Watch), and restarts once it does not
// (ErrFollowerStopped): the next session waits out Grace and takes the table at the seam of a
// table that joins (loaded from an exact snapshot while its slot keeps the later changes). The
// session checks again under coverage.LockFollowing in the transaction that opens its spans and
// records its snapshot-only tables (Claim), where daemons that start at once take turns, and ends
// the open spans that stopped slots still have of its tables: their streams no longer follow them.
//
// The running lock is a session-level advisory lock (PostgreSQL docs, "Advisory Locks",
// https://www.postgresql.org/docs/current/explicit-locking.html#ADVISORY-LOCKS): PostgreSQL
// releases it when the connection that holds it ends, so a killed daemon holds nothing.
package overlap
