package engine

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// This file decides, in one place, what the daemon does after a session ended with an error:
// from typed errors and SQLSTATE codes (PostgreSQL docs Appendix A), never from message text,
// which changes with the server's lc_messages.

// decision is what the daemon does after a session failed.
type decision int

const (
	// stop: retrying cannot fix it (bad configuration, an unusable source or target); Run returns
	// the error.
	stop decision = iota
	// backOff: a transient failure of the source or target; reconnect after an exponential backoff.
	backOff
	// restart: the session ended on purpose, for the next one to pick up a change on the source
	// (publication membership, the slot, a table's columns, an enum's labels); restart at once.
	restart
)

// permanentError marks a failure that retrying cannot fix (bad configuration, an unusable source
// or target); the daemon stops with it.
type permanentError struct{ err error }

// Error returns the wrapped error's message.
func (e permanentError) Error() string { return e.err.Error() }

// Unwrap returns the wrapped error.
func (e permanentError) Unwrap() error { return e.err }

func permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// retryableCodes are the SQLSTATE codes after which the next session can succeed: the server
// object is in use (a replication slot still active), a lock another session holds was not
// granted in time (a lock_timeout someone set), a target table was dropped while streaming (the
// next session recreates and reloads it), a column was dropped or renamed on the source while a
// load read it (the next session describes the table again), a publication change whose commit
// came too late (cdc.PublishHooks.CommitWithin: the source rolled it back), objects of the
// operator's depend on a target column pgconverge must drop (one the source created again: the
// next session replaces it once they are dropped).
var retryableCodes = map[string]bool{
	pgerrcode.ObjectInUse:                     true,
	pgerrcode.LockNotAvailable:                true,
	pgerrcode.UndefinedTable:                  true,
	pgerrcode.UndefinedColumn:                 true,
	pgerrcode.IdleInTransactionSessionTimeout: true,
	pgerrcode.DependentObjectsStillExist:      true,
}

// retryableClasses are the SQLSTATE classes of failures an operator or time can fix while the
// daemon waits: integrity constraint violations (a constraint of the target that rejects a source
// row: the batch is never skipped, it is tried again until the constraint is changed), connection
// exceptions, transaction rollbacks (serialization failures, deadlocks), insufficient resources (a
// full disk), operator intervention (a server shutting down or starting), system errors.
var retryableClasses = map[string]bool{"23": true, "08": true, "40": true, "53": true, "57": true, "58": true}

// decide classifies the error a session ended with. A statement that passed its deadline
// (*pgsession.TimeoutError) backs off whatever else the error holds: its connection was closed,
// so what failed after it failed on that.
func decide(err error) decision {
	var timeout *pgsession.TimeoutError
	if errors.As(err, &timeout) {
		return backOff
	}
	var perm permanentError
	var schema *cdc.SchemaChangeError
	var watch watchError
	var enumCheck enumCheckError
	var keyLost keyLostError
	var overlap followedElsewhereError
	switch {
	case errors.As(err, &perm):
		return stop
	case errors.Is(err, errMembershipChanged), errors.Is(err, errSlotMoved), errors.Is(err, errEnumChanged),
		errors.Is(err, errFollowerStopped), errors.As(err, &schema), lostLeadership(err):
		return restart
	case errors.As(err, &watch), errors.As(err, &enumCheck), errors.As(err, &keyLost), errors.As(err, &overlap), errors.Is(err, cdc.ErrSlotBusy), errors.Is(err, cdc.ErrSlotMissing),
		errors.Is(err, cdc.ErrSourceSilent), errors.Is(err, errSlotLost),
		// A load stopped by a source table rewrite resumes from a new snapshot in the next session.
		errors.Is(err, backfill.ErrRewritten):
		return backOff
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if retryableCodes[pgErr.Code] || len(pgErr.Code) == 5 && retryableClasses[pgErr.Code[:2]] {
			return backOff
		}
		return stop
	}
	if connectionFailed(err) {
		return backOff
	}
	return stop
}

// connectionFailed reports whether err is a failure of the connection itself (it could not be
// opened, broke, timed out or was closed), not an answer of the server.
func connectionFailed(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed)
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

// lostLeadership reports whether err ended a session because the daemon lost its leadership of
// the slot: its lock connection failed, or a write found a newer leader's epoch.
func lostLeadership(err error) bool {
	var fenced *apply.FencedError
	return errors.Is(err, errLeadershipLost) || errors.As(err, &fenced)
}

// isCode reports whether err wraps a *pgconn.PgError with SQLSTATE code.
func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// retryable reports whether the daemon starts another session after err: a transient failure or
// a restart on purpose.
func retryable(err error) bool { return decide(err) != stop }

// RetryReasons are the values reason returns, the labels of the session retry metric.
var RetryReasons = []string{"restart", "leadership", "watch", "slot-busy", "slot-lost", "schema", "overlap", "lock", "constraint", "conflict", "resources", "connection", "timeout", "other"}

// reason names the kind of failure err is, for the session retry metric: "leadership" when the
// daemon lost its leadership of the slot, "restart" for another restart on purpose, "constraint", "lock", "conflict" (serialization, deadlock), "resources",
// "connection", "slot-busy", "slot-lost" (the source invalidated the slot), "watch", "schema" (a
// table changed while it was read, or objects of the operator's depend on what a schema change
// drops on the target), "overlap" (a selected table is followed by the running daemon of another
// slot), "timeout" (a statement of the session's start, catalog checks or ledger bookkeeping
// passed its deadline: *pgsession.TimeoutError), or "other".
func reason(err error) string {
	var pgErr *pgconn.PgError
	var watch watchError
	var timeout *pgsession.TimeoutError
	switch {
	case errors.As(err, &followedElsewhereError{}):
		return "overlap"
	case lostLeadership(err):
		return "leadership"
	case errors.As(err, &timeout):
		return "timeout"
	case decide(err) == restart:
		return "restart"
	case errors.As(err, &watch):
		return "watch"
	case errors.Is(err, cdc.ErrSlotBusy), isCode(err, pgerrcode.ObjectInUse):
		return "slot-busy"
	case errors.Is(err, errSlotLost):
		return "slot-lost"
	case errors.Is(err, backfill.ErrRewritten), errors.As(err, &keyLostError{}), isCode(err, pgerrcode.UndefinedColumn), isCode(err, pgerrcode.UndefinedTable),
		isCode(err, pgerrcode.DependentObjectsStillExist):
		return "schema"
	case isCode(err, pgerrcode.LockNotAvailable):
		return "lock"
	case errors.As(err, &pgErr) && len(pgErr.Code) == 5:
		switch pgErr.Code[:2] {
		case "23":
			return "constraint"
		case "40":
			return "conflict"
		case "53":
			return "resources"
		case "08", "57":
			return "connection"
		}
		return "other"
	case errors.As(err, &pgErr):
		return "other"
	}
	return "connection"
}

// hint returns advice for an operator about a failure the daemon retries, or "".
func hint(err error) string {
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	var timeout *pgsession.TimeoutError
	switch {
	case errors.As(err, &timeout):
		return "the " + timeout.Role + " stopped answering behind an open connection (a frozen host or proxy, or a network that drops packets, which TCP keepalives do not notice while the peer's kernel still acknowledges), or a statement waited that long for a lock (pg_locks on the " + timeout.Role + " shows who holds it): the daemon reconnects; check the network between this host and the " + timeout.Role
	case errors.Is(err, errEnumChanged):
		return "an enum label was added or renamed on the source: the next session changes the target's type alike"
	case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "23") && strings.HasPrefix(pgErr.TableName, "pgconverge_stage"):
		return "pgconverge's staging copy of a target table refused a row, most likely a change of the source without a value for a key column; this is no constraint of yours: report it with this log line, the daemon retries meanwhile"
	case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "23"):
		return "a constraint of the target table rejects a row of the source (the error names the constraint and the row): change or drop that constraint on the target; the daemon retries the same changes until then and never skips them"
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable:
		return "a lock held by another session was not granted in time: the daemon retries; pg_locks on that server shows who holds it"
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.ObjectInUse:
		return "another process holds the replication slot: a second pgconverge with the same --slot, or the walsender of a killed one that the source has not noticed yet (then it frees the slot within wal_sender_timeout)"
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable:
		return "a table is missing; if a target table was dropped, the next session recreates and reloads it"
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedColumn:
		return "a column was dropped or renamed on the source while it was read: the next session describes the table again"
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.DependentObjectsStillExist:
		return "objects on the target (" + pgErr.Detail + ") depend on a target column, table or live view that pgconverge must drop to follow a change of the source (most likely a column the source dropped and added again): drop or change them; the daemon retries meanwhile"
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.DiskFull:
		return "a disk of the server that reported it is full (the error names the file): free space or grow the filesystem there; nothing was committed from the failed transaction, and the daemon retries the same changes until it succeeds"
	case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "53"):
		return "the server that reported it lacks a resource (memory, connections, disk): the error names it; the daemon retries the same changes"
	case errors.Is(err, errSlotLost):
		return "the source removed WAL the slot still needed because it held more than max_slot_wal_keep_size (a load, or a lag, longer than the source keeps WAL for): raise max_slot_wal_keep_size on the source (ALTER SYSTEM SET max_slot_wal_keep_size = '…'; -1 keeps all), or it happens again at the next load; the next session creates the slot anew and backfills what was not streamed"
	case errors.Is(err, cdc.ErrSourceSilent):
		return "the replication connection went silent without an error (a network dropping packets, a hung server or proxy): the daemon reconnects; check the network between this host and the source"
	case errors.As(err, &connectErr):
		return "check that the server is running and that the URL's host, port and database are right"
	}
	return ""
}
