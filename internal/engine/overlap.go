package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
)

// One table is followed by one daemon. Two daemons with different slots whose selections share a
// table would each record the table's publication membership under their own publication, find
// the other's token at each start, and load the table again, over and over; their streams would
// also write it twice. So a session takes no table that the running daemon of another slot
// follows: it checks before it creates anything for its stream, and again under
// coverage.LockFollowing in the transaction that opens its spans (recordCoverage), where two
// daemons that start at once take turns. A daemon that is stopped holds nothing: whoever starts
// first while the other is stopped follows the table, and the other then waits.

// followedElsewhereError ends a session whose selection holds tables that the running daemon of
// another slot follows. The daemon retries with backoff (the operator fixes one of the two
// selections, or stops the other daemon), writing nothing for its stream meanwhile.
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
		fmt.Fprintf(&b, "%s is followed by the running daemon of slot %q (%s, leading since %s)", f.Table, f.Slot, l.Holder, l.AcquiredAt)
	}
	return b.String() + ": one table is followed by one daemon (two would reload it from each other); take the table out of one daemon's selection (--tables, or ALTER PUBLICATION … DROP TABLE for a daemon without --tables) or stop the other daemon; this daemon writes nothing for its stream and tries again until then"
}

// checkFollowedElsewhere returns a followedElsewhereError when a daemon of another slot that runs
// now (holds its leader lock) follows one of names, the session's selected tables, reading on db:
// s.tgt, or a transaction on it that holds coverage.LockFollowing.
func (s *session) checkFollowedElsewhere(ctx context.Context, db coverage.DB, names []changebatch.TableName) error {
	followers, err := coverage.FollowedElsewhere(ctx, db, s.cfg.Slot, names)
	if err != nil || len(followers) == 0 {
		return err
	}
	leaders, err := apply.ReadLeaders(ctx, s.tgt)
	if err != nil {
		return err
	}
	var live []coverage.Follower
	for _, f := range followers {
		if leaders[f.Slot].Alive {
			live = append(live, f)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return followedElsewhereError{followers: live, leaders: leaders}
}
