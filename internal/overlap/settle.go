package overlap

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/disposition"
)

// Poll is how often, in production, a session looks again whether the other daemon runs (Settle,
// Watch); logEvery how often a waiting session says so (and, when it writes nothing, describes
// its selection again: the operator's fix may be a change of it). Grace is how long, in
// production, a slot that follows a selected table must look stopped before a session takes the
// table: a daemon whose target connections all failed (a target restart) takes its running lock
// again within PresenceCheckEvery of the target's return, and must not find its tables taken by a
// daemon that was quicker.
const (
	Poll     = 5 * time.Second
	logEvery = time.Minute
	Grace    = 10 * time.Second
)

// Selection is what a session selected, as Settle sees it.
type Selection struct {
	// DescribedAt is a source position read before the tables were described.
	DescribedAt pglogrepl.LSN
	// Streamed are the selected tables to stream; SnapshotOnly those kept by snapshots only.
	Streamed, SnapshotOnly []changebatch.TableName
}

// all returns the selected tables, streamed ones first.
func (sel Selection) all() []changebatch.TableName {
	return append(slices.Clone(sel.Streamed), sel.SnapshotOnly...)
}

// without returns sel without the tables waiting names.
func (sel Selection) without(waiting []coverage.Follower) Selection {
	left := func(n changebatch.TableName) bool { return Followed(waiting, n) }
	sel.Streamed = slices.DeleteFunc(slices.Clone(sel.Streamed), left)
	sel.SnapshotOnly = slices.DeleteFunc(slices.Clone(sel.SnapshotOnly), left)
	return sel
}

// Settle is the step of a session's start, after it leads its slot, that decides which selected
// tables it leaves to running daemons of other slots (Run).
type Settle struct {
	// Target is the session's target connection: Run reads who follows what on it and records
	// what the session waits for (coverage.RecordWaits).
	Target *pgx.Conn
	// Slot is the session's slot.
	Slot string
	// Grace is how long a follower's slot must look stopped before the session takes its table
	// (Grace in production); Poll how often Run looks again (Poll in production).
	Grace, Poll time.Duration
	// Logger gets the waits, at ERROR, and the takeovers, at INFO.
	Logger *slog.Logger
	// Retried counts a session retry of reason "overlap" (the daemon's Monitor.SessionRetried).
	Retried func(reason string)
	// Describe describes the session's selection again (the source may have changed while it
	// waited); the session's own description changes with it.
	Describe func(ctx context.Context) (Selection, error)
	// Idle runs before each wait: the session closes its replication connection.
	Idle func(ctx context.Context)
}

// Run returns, once the session knows which tables of sel it leaves to running daemons of other
// slots, its selection without them (with the source position of its latest description) and
// those tables with their followers, one each (waiting, which coverage.RecordWaits records,
// forgetting what an earlier session waited for; each is logged at ERROR with its follower and
// the fix). While a selected table is followed by a slot none of whose daemons runs, it waits
// until that has lasted Grace (then the session takes the table: Claim), and while every selected
// table is followed by a running daemon of another slot it waits too, writing nothing but what it
// waits for, logging at ERROR and counting retry reason "overlap" at first and every minute, and
// describing the selection again every minute. Meanwhile the session keeps leading its slot;
// Run calls Idle and looks again every Poll; after a wait it describes the selection again
// before it goes on.
func (s Settle) Run(ctx context.Context, sel Selection) (Selection, []coverage.Follower, error) {
	var logged, since, stoppedSince, described time.Time
	fresh := true
	for {
		running, stopped, leaders, err := followers(ctx, s.Target, s.Target, s.Slot, sel.all())
		if err != nil {
			return Selection{}, nil, err
		}
		stopped = slices.DeleteFunc(stopped, func(f coverage.Follower) bool { return Followed(running, f.Table) })
		if len(stopped) == 0 {
			stoppedSince = time.Time{}
		}
		switch {
		case len(stopped) > 0 && stoppedSince.IsZero():
			stoppedSince = time.Now()
			s.Logger.Info("a selected table is followed by a slot none of whose daemons runs: this daemon takes it over unless one shows within the grace",
				"slot", s.Slot, "table", stopped[0].Table.String(), "from_slot", stopped[0].Slot, "grace", s.Grace.String())
		case len(stopped) > 0 && time.Since(stoppedSince) < s.Grace:
		case len(running) > 0 && !slices.ContainsFunc(sel.all(), func(n changebatch.TableName) bool { return !Followed(running, n) }):
			if since.IsZero() {
				since = time.Now()
			}
			if err := coverage.RecordWaits(ctx, s.Target, s.Slot, running); err != nil {
				return Selection{}, nil, err
			}
			if time.Since(logged) >= logEvery {
				s.Retried(disposition.ReasonOverlap.String())
				s.Logger.Error("waiting: every selected table is followed by a running daemon of another slot, so this daemon writes nothing for its stream", "slot", s.Slot,
					"err", FollowedElsewhereError{running, leaders}.Error(), "waited", time.Since(since).Round(time.Second).String(), "looks_again_every", s.Poll.String())
				logged = time.Now()
			}
		case !fresh:
			// The source may have changed while this session waited.
			if sel, err = s.Describe(ctx); err != nil {
				return Selection{}, nil, err
			}
			fresh, described = true, time.Now()
			continue
		default:
			if !since.IsZero() {
				s.Logger.Info("a selected table is no longer followed by a running daemon of another slot: this daemon goes on", "slot", s.Slot,
					"waited", time.Since(since).Round(time.Second).String())
			}
			waiting, err := s.leave(ctx, running, leaders)
			if err != nil {
				return Selection{}, nil, err
			}
			return sel.without(waiting), waiting, nil
		}
		s.Idle(ctx)
		select {
		case <-ctx.Done():
			return Selection{}, nil, context.Cause(ctx)
		case <-time.After(s.Poll):
		}
		fresh = false
		if described.IsZero() {
			described = time.Now()
		}
		if time.Since(described) >= logEvery {
			if sel, err = s.Describe(ctx); err != nil {
				return Selection{}, nil, err
			}
			fresh, described = true, time.Now()
		}
	}
}

// leave returns the tables running follows, one follower each, records them on the target
// (coverage.RecordWaits, which forgets what an earlier session waited for) and logs them at ERROR
// with their followers and the fix.
func (s Settle) leave(ctx context.Context, running []coverage.Follower, leaders map[string]apply.LeaderState) ([]coverage.Follower, error) {
	var waiting []coverage.Follower
	for _, f := range running {
		if !Followed(waiting, f.Table) {
			waiting = append(waiting, f)
		}
	}
	if err := coverage.RecordWaits(ctx, s.Target, s.Slot, waiting); err != nil {
		return nil, err
	}
	if len(waiting) > 0 {
		s.Logger.Error("waiting for a table: it is followed by a running daemon of another slot; this daemon leaves it to that one and follows its other tables", "slot", s.Slot,
			"err", FollowedElsewhereError{waiting, leaders}.Error(), "looks_again_every", s.Poll.String())
	}
	return waiting, nil
}
