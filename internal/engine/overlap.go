package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/disposition"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// One table is followed by one daemon. Two daemons with different slots whose selections share a
// table would each record the table's publication membership under their own publication, find
// the other's token at each start, and load the table again, over and over; two that both keep a
// snapshot-only table would back it up twice. So a session takes no table that a running daemon of
// another slot follows (its slot has an open span of the table, or keeps it by snapshots:
// pgconverge.tables.kept_by, and one of its daemons holds the slot's running lock, which a daemon
// holds for as long as its process runs: holdPresence). After leading its slot, a session leaves
// those tables to that daemon (settleOverlap): it does not publish, create, load, stream or back
// them up (its stream skips the changes of a published table it does not select), records what it
// waits for (coverage.RecordWaits, for status and coverage), and follows its other tables; one
// whose every table is followed elsewhere writes nothing for its stream and waits. While streaming
// it looks every overlapPoll whether the other daemon still runs (watchWaiting), and restarts once
// it does not: the next session waits out overlapGrace and takes the table at the seam of a table
// that joins (loaded from an exact snapshot while its slot keeps the later changes).
// recordCoverage checks again under coverage.LockFollowing in the transaction that opens its spans
// and records its snapshot-only tables (claimTables), where daemons that start at once take turns,
// and ends the open spans that stopped slots still have of its tables: their streams no longer
// follow them.

// overlapPoll is how often a session looks again whether the other daemon runs; overlapLogEvery
// how often a waiting session says so (and, when it writes nothing, describes its selection again:
// the operator's fix may be a change of it). overlapGrace is how long a slot that follows a
// selected table must look stopped before a session takes the table: a daemon whose target
// connections all failed (a target restart) takes its running lock again within
// presenceCheckEvery of the target's return, and must not find its tables taken by a daemon that
// was quicker.
const (
	overlapPoll     = 5 * time.Second
	overlapLogEvery = time.Minute
	overlapGrace    = 10 * time.Second
)

// overlapGrace returns overlapGrace, or Knobs.overlapGrace when set.
func (s *session) overlapGrace() time.Duration { return knobOr(s.cfg.Knobs.OverlapGrace, overlapGrace) }

// overlapPoll returns overlapPoll, or Knobs.overlapPoll when set.
func (s *session) overlapPoll() time.Duration { return knobOr(s.cfg.Knobs.OverlapPoll, overlapPoll) }

// errFollowerStopped ends a session that left a table to a daemon of another slot once no daemon
// of that slot runs: the next session, started at once, takes the table.
var errFollowerStopped = disposition.New("the daemon of another slot that followed a selected table stopped", disposition.Mark{Action: disposition.Restart, Reason: disposition.ReasonRestart})

// followedElsewhereError is a session's selection holding tables that a running daemon of another
// slot follows.
type followedElsewhereError struct {
	followers []coverage.Follower
	leaders   map[string]apply.LeaderState
}

// Mark says that the daemon backs off (reason "overlap") until the other daemon stops or the
// operator takes the table out of one selection.
func (e followedElsewhereError) Mark() disposition.Mark {
	return disposition.Mark{Action: disposition.BackOff, Reason: disposition.ReasonOverlap}
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
	return b.String() + ": one table is followed by one daemon (two would reload it from each other); take the table out of one daemon's selection (--tables, or ALTER PUBLICATION … DROP TABLE for a daemon without --tables) or stop the other daemon; this daemon leaves the table to it until then, and takes it over once that daemon stopped"
}

// followedElsewhere returns the tables among names, selected tables, that a slot other than the
// session's follows (coverage.FollowedElsewhere, read on db: conn, or a transaction on it), split
// by whether a daemon of that slot runs now, and the slots' leaders (read on conn).
func (s *session) followedElsewhere(ctx context.Context, conn *pgx.Conn, db coverage.DB, names []changebatch.TableName) (running, stopped []coverage.Follower, leaders map[string]apply.LeaderState, err error) {
	followers, err := coverage.FollowedElsewhere(ctx, db, s.cfg.Slot, names)
	if err != nil || len(followers) == 0 {
		return nil, nil, nil, err
	}
	if leaders, err = apply.ReadLeaders(ctx, conn); err != nil {
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

// settleOverlap returns, once the session knows which selected tables it leaves to running
// daemons of other slots (leave), its source position and the selected tables it follows. While a
// selected table is followed by a slot none of whose daemons runs, it waits until that has lasted
// overlapGrace (then the session takes the table: claimTables), and while every selected table is
// followed by a running daemon of another slot it waits too, writing nothing but what it waits for
// (coverage.RecordWaits), logging at ERROR and counting retry reason "overlap" at first and every
// overlapLogEvery, and describing its selection again every overlapLogEvery. Meanwhile the session
// keeps leading its slot, closes its replication connection and looks again every overlapPoll;
// after a wait it describes its selection again before it goes on.
func (s *session) settleOverlap(ctx context.Context, describedAt pglogrepl.LSN, names []changebatch.TableName) (pglogrepl.LSN, []changebatch.TableName, error) {
	var logged, since, stoppedSince, described time.Time
	fresh := true
	for {
		running, stopped, leaders, err := s.followedElsewhere(ctx, s.tgt, s.tgt, s.selected(names))
		if err != nil {
			return 0, nil, err
		}
		stopped = slices.DeleteFunc(stopped, func(f coverage.Follower) bool { return followed(running, f.Table) })
		if len(stopped) == 0 {
			stoppedSince = time.Time{}
		}
		switch {
		case len(stopped) > 0 && stoppedSince.IsZero():
			stoppedSince = time.Now()
			s.cfg.Logger.Info("a selected table is followed by a slot none of whose daemons runs: this daemon takes it over unless one shows within the grace",
				"slot", s.cfg.Slot, "table", stopped[0].Table.String(), "from_slot", stopped[0].Slot, "grace", s.overlapGrace().String())
		case len(stopped) > 0 && time.Since(stoppedSince) < s.overlapGrace():
		case len(running) > 0 && !slices.ContainsFunc(s.selected(names), func(n changebatch.TableName) bool { return !followed(running, n) }):
			if since.IsZero() {
				since = time.Now()
			}
			if err := coverage.RecordWaits(ctx, s.tgt, s.cfg.Slot, running); err != nil {
				return 0, nil, err
			}
			if time.Since(logged) >= overlapLogEvery {
				s.mon.SessionRetried("overlap")
				s.cfg.Logger.Error("waiting: every selected table is followed by a running daemon of another slot, so this daemon writes nothing for its stream", "slot", s.cfg.Slot,
					"err", followedElsewhereError{running, leaders}.Error(), "waited", time.Since(since).Round(time.Second).String(), "looks_again_every", s.overlapPoll().String())
				logged = time.Now()
			}
		case !fresh:
			// The source may have changed while this session waited.
			if describedAt, names, err = s.describe(ctx); err != nil {
				return 0, nil, err
			}
			fresh, described = true, time.Now()
			continue
		default:
			if !since.IsZero() {
				s.cfg.Logger.Info("a selected table is no longer followed by a running daemon of another slot: this daemon goes on", "slot", s.cfg.Slot,
					"waited", time.Since(since).Round(time.Second).String())
			}
			names, err = s.leave(ctx, names, running, leaders)
			return describedAt, names, err
		}
		if s.repl != nil {
			s.repl.Close(ctx)
			s.repl = nil
		}
		select {
		case <-ctx.Done():
			return 0, nil, context.Cause(ctx)
		case <-time.After(s.overlapPoll()):
		}
		fresh = false
		if described.IsZero() {
			described = time.Now()
		}
		if time.Since(described) >= overlapLogEvery {
			if describedAt, names, err = s.describe(ctx); err != nil {
				return 0, nil, err
			}
			fresh, described = true, time.Now()
		}
	}
}

// selected returns names, the selected tables to stream, followed by the selected tables kept by
// snapshots only.
func (s *session) selected(names []changebatch.TableName) []changebatch.TableName {
	out := slices.Clone(names)
	for _, t := range s.snapshotOnly {
		out = append(out, t.TableName)
	}
	return out
}

// followed reports whether table n is among followers.
func followed(followers []coverage.Follower, n changebatch.TableName) bool {
	return slices.ContainsFunc(followers, func(f coverage.Follower) bool { return f.Table == n })
}

// leave takes the tables running follows out of the session's selection (names, which it returns
// without them, s.tables and s.snapshotOnly), notes them in s.waiting, records them on the target
// (coverage.RecordWaits, which forgets what an earlier session waited for) and logs each at ERROR
// with its follower and the fix.
func (s *session) leave(ctx context.Context, names []changebatch.TableName, running []coverage.Follower, leaders map[string]apply.LeaderState) ([]changebatch.TableName, error) {
	s.waiting = nil
	for _, f := range running {
		if !followed(s.waiting, f.Table) {
			s.waiting = append(s.waiting, f)
		}
	}
	if err := coverage.RecordWaits(ctx, s.tgt, s.cfg.Slot, s.waiting); err != nil {
		return nil, err
	}
	if len(s.waiting) == 0 {
		return names, nil
	}
	left := func(n changebatch.TableName) bool { return followed(s.waiting, n) }
	s.tables = slices.DeleteFunc(s.tables, func(t changebatch.Table) bool { return left(t.TableName) })
	s.snapshotOnly = slices.DeleteFunc(s.snapshotOnly, func(t changebatch.Table) bool { return left(t.TableName) })
	s.cfg.Logger.Error("waiting for a table: it is followed by a running daemon of another slot; this daemon leaves it to that one and follows its other tables", "slot", s.cfg.Slot,
		"err", followedElsewhereError{s.waiting, leaders}.Error(), "looks_again_every", s.overlapPoll().String())
	return slices.DeleteFunc(slices.Clone(names), left), nil
}

// waitsFor reports whether table n is one the session leaves to a daemon of another slot.
func (s sessionStart) waitsFor(n changebatch.TableName) bool { return followed(s.waiting, n) }

// watchWaiting runs with the stream while the session leaves tables to daemons of other slots
// (s.waiting): over a target connection of its own it counts retry reason "overlap" at once, then
// looks every overlapPoll whether those daemons still run, logging at ERROR and counting "overlap"
// again every overlapLogEvery. It returns an error wrapping errFollowerStopped once a table's
// follower runs no more (the next session takes the table, after overlapGrace), and nil at once
// when the session waits for nothing.
func (s *session) watchWaiting(ctx context.Context) error {
	if len(s.waiting) == 0 {
		return nil
	}
	conn, err := pgsession.Connect(ctx, s.cfg.Target, "target")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	names := make([]changebatch.TableName, len(s.waiting))
	for i, f := range s.waiting {
		names[i] = f.Table
	}
	s.mon.SessionRetried("overlap")
	logged := time.Now()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(s.overlapPoll()):
		}
		running, _, leaders, err := s.followedElsewhere(ctx, conn, conn, names)
		if err != nil {
			return err
		}
		for _, f := range s.waiting {
			if !followed(running, f.Table) {
				return fmt.Errorf("%w: %s is no longer followed by a running daemon of slot %q: restarting the session to take it over (after a grace of %s, loaded from an exact snapshot while the slot keeps its later changes)",
					errFollowerStopped, f.Table, f.Slot, s.overlapGrace())
			}
		}
		if time.Since(logged) >= overlapLogEvery {
			s.mon.SessionRetried("overlap")
			s.cfg.Logger.Error("waiting for a table: it is followed by a running daemon of another slot; this daemon leaves it to that one and follows its other tables", "slot", s.cfg.Slot,
				"err", followedElsewhereError{running, leaders}.Error(), "looks_again_every", s.overlapPoll().String())
			logged = time.Now()
		}
	}
}

// claimTables, in recordCoverage's transaction tx, takes coverage.LockFollowing, returns a
// followedElsewhereError when a running daemon of another slot follows one of the session's tables
// (the session ends and the next one leaves the table), and otherwise ends the open spans that
// stopped slots have of them (from now on this slot follows them) and records that this slot keeps
// its snapshot-only tables (coverage.KeepSnapshotOnly).
func (s *session) claimTables(ctx context.Context, tx coverage.DB) error {
	if err := coverage.LockFollowing(ctx, tx); err != nil {
		return err
	}
	running, stopped, leaders, err := s.followedElsewhere(ctx, s.tgt, tx, s.selected(s.names))
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
	return coverage.KeepSnapshotOnly(ctx, tx, s.cfg.Slot, s.selected(nil))
}
