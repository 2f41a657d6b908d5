package engine

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
)

// confirmLimit is a source position up to which every streamed table was published, and
// described, as at the session's start: the catalog watcher's goroutine, which owns it, raises it
// after each check that found nothing changed (catalogWatcher.checkMemberships); the stream
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
	// recorded is the last position recorded by a committed transaction.
	recorded pglogrepl.LSN
}

// record confirms the streamed tables' open spans up to the limit in tx when the limit passed
// the position recorded last, and returns the limit it read, which committed takes once tx
// committed.
func (c *spanConfirmer) record(ctx context.Context, tx pgx.Tx) (pglogrepl.LSN, error) {
	limit := c.limit.get()
	if limit > c.recorded {
		if err := coverage.ConfirmSpans(ctx, tx, c.slot, c.names, limit); err != nil {
			return 0, err
		}
	}
	return limit, nil
}

// committed notes that the transaction in which record returned at committed.
func (c *spanConfirmer) committed(at pglogrepl.LSN) { c.recorded = max(c.recorded, at) }
