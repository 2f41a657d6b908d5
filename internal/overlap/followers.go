package overlap

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/disposition"
)

// ErrFollowerStopped ends a session that left a table to a daemon of another slot once no daemon
// of that slot runs (Watch): the next session, started at once, takes the table.
var ErrFollowerStopped = disposition.New("the daemon of another slot that followed a selected table stopped", disposition.Mark{Action: disposition.Restart, Reason: disposition.ReasonRestart})

// FollowedElsewhereError is a session's selection holding tables that a running daemon of another
// slot follows (Claim).
type FollowedElsewhereError struct {
	// Followers are the shared tables, each with the slot that follows it.
	Followers []coverage.Follower
	// Leaders are the slots' leader states, by slot (apply.ReadLeaders), for the message.
	Leaders map[string]apply.LeaderState
}

// Mark says that the daemon backs off (reason "overlap") until the other daemon stops or the
// operator takes the table out of one selection.
func (e FollowedElsewhereError) Mark() disposition.Mark {
	return disposition.Mark{Action: disposition.BackOff, Reason: disposition.ReasonOverlap}
}

// Error names each shared table, the slot that follows it and that slot's leader, and the fix.
func (e FollowedElsewhereError) Error() string {
	var b strings.Builder
	for i, f := range e.Followers {
		if i > 0 {
			b.WriteString("; ")
		}
		l := e.Leaders[f.Slot]
		fmt.Fprintf(&b, "%s is followed by a running daemon of slot %q (last leader %s, since %s)", f.Table, f.Slot, l.Holder, l.AcquiredAt)
	}
	return b.String() + ": one table is followed by one daemon (two would reload it from each other); take the table out of one daemon's selection (--tables, or ALTER PUBLICATION … DROP TABLE for a daemon without --tables) or stop the other daemon; this daemon leaves the table to it until then, and takes it over once that daemon stopped"
}

// Followed reports whether table n is among followers.
func Followed(followers []coverage.Follower, n changebatch.TableName) bool {
	return slices.ContainsFunc(followers, func(f coverage.Follower) bool { return f.Table == n })
}

// followers returns the tables among names, selected tables, that a slot other than slot follows
// (coverage.FollowedElsewhere, read on db: conn, or a transaction on it), split by whether a
// daemon of that slot runs now, and the slots' leaders (read on conn).
func followers(ctx context.Context, conn *pgx.Conn, db coverage.DB, slot string, names []changebatch.TableName) (running, stopped []coverage.Follower, leaders map[string]apply.LeaderState, err error) {
	all, err := coverage.FollowedElsewhere(ctx, db, slot, names)
	if err != nil || len(all) == 0 {
		return nil, nil, nil, err
	}
	if leaders, err = apply.ReadLeaders(ctx, conn); err != nil {
		return nil, nil, nil, err
	}
	for _, f := range all {
		if leaders[f.Slot].Running {
			running = append(running, f)
		} else {
			stopped = append(stopped, f)
		}
	}
	return running, stopped, leaders, nil
}

// Claim, in the transaction tx of a session of slot that records its coverage (conn is the
// connection tx runs on), takes coverage.LockFollowing, returns a FollowedElsewhereError when a
// running daemon of another slot follows one of the session's tables (streamed, or snapshotOnly:
// kept by snapshots only; the session ends and the next one leaves the table), and otherwise ends
// the open spans that stopped slots have of them (from now on this slot follows them), logging
// each at INFO on logger, and records that slot keeps snapshotOnly (coverage.KeepSnapshotOnly).
func Claim(ctx context.Context, conn *pgx.Conn, tx coverage.DB, slot string, streamed, snapshotOnly []changebatch.TableName, logger *slog.Logger) error {
	if err := coverage.LockFollowing(ctx, tx); err != nil {
		return err
	}
	running, stopped, leaders, err := followers(ctx, conn, tx, slot, append(slices.Clone(streamed), snapshotOnly...))
	if err != nil {
		return err
	}
	if len(running) > 0 {
		return FollowedElsewhereError{running, leaders}
	}
	for _, f := range stopped {
		reason := fmt.Sprintf("followed by slot %q", slot)
		if err := coverage.EndSpans(ctx, tx, f.Slot, []changebatch.TableName{f.Table}, reason); err != nil {
			return err
		}
		logger.Info("taking a table over from a stopped daemon of another slot: that slot's coverage of it ends at its progress", "table", f.Table.String(), "from_slot", f.Slot, "slot", slot)
	}
	return coverage.KeepSnapshotOnly(ctx, tx, slot, snapshotOnly)
}
