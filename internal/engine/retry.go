package engine

import (
	"errors"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/internal/disposition"
)

// The daemon's names for the retry rules of internal/disposition (Decide, ReasonOf, Hint), which
// decide what it does after a session ended with an error, and the marks it puts on refusals.

// decision is what the daemon does after a session failed.
type decision = disposition.Action

const (
	// stop: retrying cannot fix it; Run returns the error.
	stop = disposition.Stop
	// backOff: a transient failure; reconnect after an exponential backoff.
	backOff = disposition.BackOff
	// restart: the session ended on purpose; restart at once.
	restart = disposition.Restart
)

// permanent marks err as a failure that retrying cannot fix (bad configuration, an unusable source
// or target): the daemon stops with it. It returns nil for nil.
func permanent(err error) error {
	return disposition.Wrap(err, disposition.Mark{Action: disposition.Stop})
}

// refusal marks err, from a check that refuses what only an operator can change (a setting, a
// table without a key, another source's ledger), permanent, unless the check could not run: its
// connection failed or its server is shutting down (SQLSTATE class 57), which the next session
// tries again like any other session failure.
func refusal(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || connectionFailed(err) || errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "57") {
		return err
	}
	return permanent(err)
}

// decide classifies the error a session ended with (disposition.Decide).
func decide(err error) decision { return disposition.Decide(err) }

// retryable reports whether the daemon starts another session after err: a transient failure or
// a restart on purpose.
func retryable(err error) bool { return decide(err) != stop }

// RetryReasons returns the values reason returns, the labels of the session retry metric, in a
// new slice each call.
func RetryReasons() []string {
	return []string{"restart", "leadership", "watch", "slot-busy", "slot-lost", "schema", "overlap", "lock", "constraint", "conflict", "resources", "connection", "timeout", "other"}
}

// reason names the kind of failure err is, for the session retry metric (disposition.ReasonOf):
// one of RetryReasons.
func reason(err error) string { return disposition.ReasonOf(err) }

// hint returns advice for an operator about a failure the daemon retries, or "" (disposition.Hint).
func hint(err error) string { return disposition.Hint(err) }

// connectionFailed reports whether err is a failure of the connection itself
// (disposition.ConnectionFailed).
func connectionFailed(err error) bool { return disposition.ConnectionFailed(err) }

// lostLeadership reports whether err ended a session because the daemon lost its leadership of
// the slot: its lock connection failed (errLeadershipLost), or a write found a newer leader's
// epoch (*apply.FencedError).
func lostLeadership(err error) bool {
	return slices.ContainsFunc(disposition.Marks(err), func(m disposition.Mark) bool {
		return m.Reason == disposition.ReasonLeadership
	})
}
