package overlap

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/disposition"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// Watch is the member of a streaming session that watches the daemons of other slots it leaves
// tables to (Run).
type Watch struct {
	// Target is the target's URL: Watch reads on a connection of its own.
	Target string
	// Slot is the session's slot.
	Slot string
	// Waiting are the selected tables the session leaves to the running daemons of other slots
	// that follow them, one follower each (Settle.Run's).
	Waiting []coverage.Follower
	// Poll is how often it looks again (Poll in production); Grace, named in the error it
	// returns, how long the next session waits before it takes a table (Grace in production).
	Poll, Grace time.Duration
	// Logger gets the waits, at ERROR.
	Logger *slog.Logger
	// Retried counts a session retry of reason "overlap" (the daemon's Monitor.SessionRetried).
	Retried func(reason string)
}

// Run counts retry reason "overlap" at once, then looks every Poll, over a target connection of
// its own, whether the daemons that follow Waiting still run, logging at ERROR and counting
// "overlap" again every minute. It returns an error wrapping ErrFollowerStopped once a table's
// follower runs no more (the next session takes the table, after Grace), ctx's error when ctx
// ends, and nil at once when Waiting is empty.
func (w Watch) Run(ctx context.Context) error {
	if len(w.Waiting) == 0 {
		return nil
	}
	conn, err := pgsession.Connect(ctx, w.Target, "target")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	names := make([]changebatch.TableName, len(w.Waiting))
	for i, f := range w.Waiting {
		names[i] = f.Table
	}
	w.Retried(disposition.ReasonOverlap.String())
	logged := time.Now()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(w.Poll):
		}
		running, _, leaders, err := followers(ctx, conn, conn, w.Slot, names)
		if err != nil {
			return err
		}
		for _, f := range w.Waiting {
			if !Followed(running, f.Table) {
				return fmt.Errorf("%w: %s is no longer followed by a running daemon of slot %q: restarting the session to take it over (after a grace of %s, loaded from an exact snapshot while the slot keeps its later changes)",
					ErrFollowerStopped, f.Table, f.Slot, w.Grace)
			}
		}
		if time.Since(logged) >= logEvery {
			w.Retried(disposition.ReasonOverlap.String())
			w.Logger.Error("waiting for a table: it is followed by a running daemon of another slot; this daemon leaves it to that one and follows its other tables", "slot", w.Slot,
				"err", FollowedElsewhereError{running, leaders}.Error(), "looks_again_every", w.Poll.String())
			logged = time.Now()
		}
	}
}
