package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
)

// One table is followed by one daemon. Two daemons with different slots whose selections share a
// table would each record the table's publication membership under their own publication, find
// the other's token at each start, and load the table again, over and over. So a session takes no
// table that a running daemon of another slot follows (its slot has an open span of the table, and
// one of its daemons holds the slot's running lock, which a daemon holds for as long as its process
// runs: holdPresence). After leading its slot, a session waits until none does (waitOutOverlap),
// before it creates anything for its stream; recordCoverage checks again under
// coverage.LockFollowing in the transaction that opens its spans, where daemons that start at once
// take turns, and ends the open spans that stopped slots still have of its tables: their streams
// no longer follow them.

// overlapPoll is how often a waiting session looks again whether the other daemon runs;
// overlapLogEvery how often it says so, and describes its selection again (the operator's fix may
// be a change of it). overlapGrace is how long a slot that follows a selected table must look
// stopped before a session takes the table: a daemon whose target connections all failed (a
// target restart) takes its running lock again within presenceCheckEvery of the target's return,
// and must not find its tables taken by a daemon that was quicker.
const (
	overlapPoll     = 5 * time.Second
	overlapLogEvery = time.Minute
	overlapGrace    = 10 * time.Second
)

// followedElsewhereError is a session's selection holding tables that a running daemon of another
// slot follows.
type followedElsewhereError struct {
	followers []coverage.Follower
	leaders   map[string]apply.LeaderState
}

// Error names each shared table, the slot that follows it and that slot's leader, and the fix.
func (e followedElsewhereError) Error() string {
	var b strings.Builder
	for i, f := range e.followers {
		if i > 0 {
			b.WriteString("; ")
		}
		l := e.leaders[f.Slot]
		fmt.Fprintf(&b, "%s is followed by a running daemon of slot %q (last leader %s, since %s)", f.Table, f.Slot, l.Holder, l.AcquiredAt)
	}
	return b.String() + ": one table is followed by one daemon (two would reload it from each other); take the table out of one daemon's selection (--tables, or ALTER PUBLICATION … DROP TABLE for a daemon without --tables) or stop the other daemon; this daemon writes nothing for its stream until then"
}

// followedElsewhere returns the tables among names, the session's selected tables, that a slot
// other than the session's follows (coverage.FollowedElsewhere, read on db: s.tgt, or a
// transaction on it), split by whether a daemon of that slot runs now, and the slots' leaders.
func (s *session) followedElsewhere(ctx context.Context, db coverage.DB, names []changebatch.TableName) (running, stopped []coverage.Follower, leaders map[string]apply.LeaderState, err error) {
	followers, err := coverage.FollowedElsewhere(ctx, db, s.cfg.Slot, names)
	if err != nil || len(followers) == 0 {
		return nil, nil, nil, err
	}
	if leaders, err = apply.ReadLeaders(ctx, s.tgt); err != nil {
		return nil, nil, nil, err
	}
	for _, f := range followers {
		if leaders[f.Slot].Running {
			running = append(running, f)
		} else {
			stopped = append(stopped, f)
		}
	}
	return running, stopped, leaders, nil
}

// waitOutOverlap returns once no running daemon of another slot follows a selected table, and a
// slot that follows one without a running daemon has looked stopped for overlapGrace, with the
// tables described again when it waited. Meanwhile the session keeps leading its slot,
// writes nothing, closes its replication connection and looks again every overlapPoll; it logs at
// ERROR which tables, which slots and the fix and counts retry reason "overlap", at first and every
// overlapLogEvery, and describes its selection again every overlapLogEvery.
func (s *session) waitOutOverlap(ctx context.Context, describedAt pglogrepl.LSN, names []changebatch.TableName) (pglogrepl.LSN, []changebatch.TableName, error) {
	var logged, since, stoppedSince time.Time
	described := time.Now()
	for {
		running, stopped, leaders, err := s.followedElsewhere(ctx, s.tgt, names)
		if err != nil {
			return 0, nil, err
		}
		switch {
		case len(running) > 0:
			stoppedSince = time.Time{}
			if since.IsZero() {
				since = time.Now()
			}
			if time.Since(logged) >= overlapLogEvery {
				s.mon.SessionRetried("overlap")
				s.cfg.Logger.Error("waiting: a selected table is followed by a running daemon of another slot", "slot", s.cfg.Slot,
					"err", followedElsewhereError{running, leaders}.Error(), "waited", time.Since(since).Round(time.Second).String(), "looks_again_every", overlapPoll.String())
				logged = time.Now()
			}
		case len(stopped) > 0 && stoppedSince.IsZero():
			stoppedSince = time.Now()
			s.cfg.Logger.Info("a selected table is followed by a slot none of whose daemons runs: this daemon takes it over unless one shows within the grace",
				"slot", s.cfg.Slot, "table", stopped[0].Table.String(), "from_slot", stopped[0].Slot, "grace", overlapGrace.String())
		case len(stopped) > 0 && time.Since(stoppedSince) < overlapGrace:
		case !since.IsZero() || !stoppedSince.IsZero():
			if since.IsZero() {
				since = stoppedSince
			}
			s.cfg.Logger.Info("no running daemon of another slot follows a selected table any more: this daemon goes on", "slot", s.cfg.Slot, "waited", time.Since(since).Round(time.Second).String())
			return s.describe(ctx) // the source may have changed meanwhile
		default:
			return describedAt, names, nil
		}
		if s.repl != nil {
			s.repl.Close(ctx)
			s.repl = nil
		}
		select {
		case <-ctx.Done():
			return 0, nil, context.Cause(ctx)
		case <-time.After(overlapPoll):
		}
		if time.Since(described) >= overlapLogEvery {
			if describedAt, names, err = s.describe(ctx); err != nil {
				return 0, nil, err
			}
			described = time.Now()
		}
	}
}

// claimTables, in recordCoverage's transaction tx, takes coverage.LockFollowing, returns a
// followedElsewhereError when a running daemon of another slot follows one of the session's tables
// (the session ends and the next one waits), and otherwise ends the open spans that stopped slots
// have of them: from now on this slot follows them.
func (s *session) claimTables(ctx context.Context, tx coverage.DB) error {
	if err := coverage.LockFollowing(ctx, tx); err != nil {
		return err
	}
	running, stopped, leaders, err := s.followedElsewhere(ctx, tx, s.names)
	if err != nil {
		return err
	}
	if len(running) > 0 {
		return followedElsewhereError{running, leaders}
	}
	for _, f := range stopped {
		reason := fmt.Sprintf("followed by slot %q", s.cfg.Slot)
		if err := coverage.EndSpans(ctx, tx, f.Slot, []changebatch.TableName{f.Table}, reason); err != nil {
			return err
		}
		s.cfg.Logger.Info("taking a table over from a stopped daemon of another slot: that slot's coverage of it ends at its progress", "table", f.Table.String(), "from_slot", f.Slot, "slot", s.cfg.Slot)
	}
	return nil
}
