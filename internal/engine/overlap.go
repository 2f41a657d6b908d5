package engine

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/overlap"
)

// One table is followed by one daemon (internal/overlap): the daemon holds its slot's running lock
// for as long as it runs (overlap.HoldPresence, in Run); after leading its slot, a session leaves
// the selected tables that a running daemon of another slot follows to it (settleOverlap), watches
// that daemon while streaming (overlapWatch) and claims its tables in the transaction that opens
// its spans (recordCoverage: overlap.Claim).

// overlapGrace returns overlap.Grace, or Knobs.OverlapGrace when set.
func (s sessionStart) overlapGrace() time.Duration {
	return knobOr(s.cfg.Knobs.OverlapGrace, overlap.Grace)
}

// overlapPoll returns overlap.Poll, or Knobs.OverlapPoll when set.
func (s sessionStart) overlapPoll() time.Duration {
	return knobOr(s.cfg.Knobs.OverlapPoll, overlap.Poll)
}

// settleOverlap returns, once the session knows which selected tables it leaves to running
// daemons of other slots (overlap.Settle), its source position and the selected tables it
// follows; it takes the tables it leaves out of s.tables and s.snapshotOnly and notes them in
// s.waiting. While it waits, it closes its replication connection and describes its selection
// again (describe).
func (s *session) settleOverlap(ctx context.Context, describedAt pglogrepl.LSN, names []changebatch.TableName) (pglogrepl.LSN, []changebatch.TableName, error) {
	settle := overlap.Settle{
		Target: s.tgt, Slot: s.cfg.Slot, Grace: s.overlapGrace(), Poll: s.overlapPoll(), Logger: s.cfg.Logger, Retried: s.mon.SessionRetried,
		Describe: func(ctx context.Context) (overlap.Selection, error) {
			describedAt, names, err := s.describe(ctx)
			return s.selection(describedAt, names), err
		},
		Idle: func(ctx context.Context) {
			if s.repl != nil {
				s.repl.Close(ctx)
				s.repl = nil
			}
		},
	}
	sel, waiting, err := settle.Run(ctx, s.selection(describedAt, names))
	if err != nil {
		return 0, nil, err
	}
	s.waiting = waiting
	s.tables = slices.DeleteFunc(s.tables, func(t changebatch.Table) bool { return s.waitsFor(t.TableName) })
	s.snapshotOnly = slices.DeleteFunc(s.snapshotOnly, func(t changebatch.Table) bool { return s.waitsFor(t.TableName) })
	return sel.DescribedAt, sel.Streamed, nil
}

// selection is the session's selection for overlap.Settle: describedAt, names (the selected
// tables to stream) and the selected tables kept by snapshots only.
func (s *session) selection(describedAt pglogrepl.LSN, names []changebatch.TableName) overlap.Selection {
	return overlap.Selection{DescribedAt: describedAt, Streamed: names, SnapshotOnly: s.snapshotOnlyNames()}
}

// snapshotOnlyNames returns the names of the selected tables kept by snapshots only.
func (s sessionStart) snapshotOnlyNames() []changebatch.TableName {
	var out []changebatch.TableName
	for _, t := range s.snapshotOnly {
		out = append(out, t.TableName)
	}
	return out
}

// waitsFor reports whether table n is one the session leaves to a daemon of another slot.
func (s sessionStart) waitsFor(n changebatch.TableName) bool { return overlap.Followed(s.waiting, n) }

// overlapWatch is the stream's member that ends the session once a daemon it leaves a table to
// stops (overlap.Watch, counting its waits on mon; it returns nil at once when the session waits
// for nothing).
func (s sessionStart) overlapWatch(mon Monitor) overlap.Watch {
	return overlap.Watch{Target: s.cfg.Target, Slot: s.cfg.Slot, Waiting: s.waiting, Poll: s.overlapPoll(), Grace: s.overlapGrace(),
		Logger: s.cfg.Logger, Retried: mon.SessionRetried}
}
