package engine

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
)

// confirmLimit is a source position up to which every streamed table was published, and
// described, as at the session's start: the catalog watcher's goroutine, which owns it, raises it
// to what its checks vouch for (voucher); the stream
// confirms the slot no further (cdc.StreamConfig.ConfirmLimit) and its apply goroutine records it
// in the ledger (spanConfirmer). 0 until the watcher vouched for a position. The zero value is
// ready; get may be called from any goroutine.
type confirmLimit struct {
	lsn atomic.Uint64
}

// set makes at the limit; only the watcher's goroutine calls it.
func (c *confirmLimit) set(at pglogrepl.LSN) { c.lsn.Store(uint64(at)) }

// get returns the limit.
func (c *confirmLimit) get() pglogrepl.LSN { return pglogrepl.LSN(c.lsn.Load()) }

// spanConfirmer records the confirm limit in the ledger (coverage.ConfirmSpans of the slot's
// tables) with the stream's transactions, once per position the limit reached. The stream's
// apply goroutine owns it: it calls record inside each transaction and committed after the
// commit.
type spanConfirmer struct {
	slot  string
	names []changebatch.TableName // the streamed tables, as at the session's start
	limit *confirmLimit
	// recorded is the last position recorded by a committed transaction, at recordedAt.
	recorded   pglogrepl.LSN
	recordedAt time.Time
}

// spanRecordEvery is how often at most the confirm limit is recorded in the ledger: the limit
// moves every few hundred milliseconds under load, and each record updates a row per table.
const spanRecordEvery = time.Second

// record confirms the streamed tables' open spans up to the limit in tx when the limit passed
// the position recorded last, at least spanRecordEvery ago, and returns the position it
// recorded (0 for none), which committed takes once tx committed.
func (c *spanConfirmer) record(ctx context.Context, tx pgx.Tx) (pglogrepl.LSN, error) {
	limit := c.limit.get()
	if limit <= c.recorded || time.Since(c.recordedAt) < spanRecordEvery {
		return 0, nil
	}
	if err := coverage.ConfirmSpans(ctx, tx, c.slot, c.names, limit); err != nil {
		return 0, err
	}
	return limit, nil
}

// committed notes that the transaction in which record returned at committed; 0 is nothing.
func (c *spanConfirmer) committed(at pglogrepl.LSN) {
	if at > c.recorded {
		c.recorded, c.recordedAt = at, time.Now()
	}
}

// voucher decides how far the catalog watcher's checks vouch for the source: up to which flushed
// source position every transaction that committed before it was visible to a check that found
// the tables as at the session's start.
//
// Each check that found nothing changed adds the flushed position it read before its snapshot
// (add), with the transactions running at that snapshot. A later such check vouches for the
// newest added position that was read at least minVouchAge before the later probe and none of
// whose running transactions the later probe found committed unseen (cdc.CatalogProbe.Unseen:
// waiting for a synchronous standby, or committed in the commit log yet invisible to its
// snapshot): a commit flushed before the position was then visible to the later check's
// snapshot, since PostgreSQL makes a flushed commit visible at once unless it waits for a
// standby. When commits may wait for a standby that the role cannot see waits of (no
// pg_read_all_stats), a position must be syncRepBlindAge old instead, as long as a standby is
// let to delay a commit unseen.
type voucher struct {
	entries []vouchEntry // oldest first
}

// vouchEntry is one check's flushed position, the transactions running at its snapshot (xid8,
// ascending) and when the position was read.
type vouchEntry struct {
	at      pglogrepl.LSN
	running []uint64
	read    time.Time
}

const (
	// minVouchAge is how old a position must be before a later check vouches for it: far longer
	// than a flushed commit takes to become visible without a standby to wait for (it marks the
	// commit log and leaves the process array at once).
	minVouchAge = 100 * time.Millisecond
	// syncRepBlindAge is minVouchAge when commits may wait for a synchronous standby whose
	// waits the role cannot see.
	syncRepBlindAge = 5 * time.Second
	// maxVouchEntries bounds the positions kept: older ones are dropped (less is vouched for,
	// never more).
	maxVouchEntries = 64
)

// add records a check that found nothing changed: at, the flushed position read before its
// snapshot, read at read (taken before the position was read), and the transactions running at
// that snapshot.
func (v *voucher) add(at pglogrepl.LSN, running []uint64, read time.Time) {
	v.entries = append(v.entries, vouchEntry{at: at, running: running, read: read})
	if len(v.entries) > maxVouchEntries {
		v.entries = slices.Delete(v.entries, 0, len(v.entries)-maxVouchEntries)
	}
}

// vouch returns the newest recorded position that a check that found nothing changed, with probe
// p sent at now, vouches for, and forgets it and every older one; ok is false when it vouches
// for none (none is old enough, or each has a running transaction that p found committed unseen,
// or a COMMIT PREPARED waits for a standby).
func (v *voucher) vouch(p cdc.CatalogProbe, now time.Time) (at pglogrepl.LSN, ok bool) {
	age := minVouchAge
	if p.SyncStandbys && !p.WaitsVisible {
		age = syncRepBlindAge
	}
	if slices.Contains(p.Unseen, 0) {
		return 0, false
	}
	for i := len(v.entries) - 1; i >= 0; i-- {
		e := v.entries[i]
		if now.Sub(e.read) < age {
			continue
		}
		if slices.ContainsFunc(p.Unseen, func(x uint64) bool { _, found := slices.BinarySearch(e.running, x); return found }) {
			continue
		}
		v.entries = slices.Delete(v.entries, 0, i+1)
		return e.at, true
	}
	return 0, false
}
