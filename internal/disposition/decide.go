package disposition

import (
	"errors"
	"io"
	"net"
	"slices"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// The rules of what the daemon does after an error: from the marks errors carry from where they
// are born and from SQLSTATE codes (PostgreSQL docs, Appendix A "PostgreSQL Error Codes"), never
// from message text, which changes with the server's lc_messages.

// Decide classifies the error a session ended with: a marked error follows its strongest mark
// (Marks: a statement past its deadline, *pgsession.TimeoutError, backs off whatever
// else the error holds, then stops, restarts, back-offs); a server's error goes by its SQLSTATE
// (ServerMark); a failed connection backs off; anything else stops.
func Decide(err error) Action {
	if marks := Marks(err); len(marks) > 0 {
		return marks[0].Action
	}
	if pgErr, ok := serverError(err); ok {
		return ServerMark(pgErr).Action
	}
	if ConnectionFailed(err) {
		return BackOff
	}
	return Stop
}

// ReasonOf names the kind of failure err is, for the session retry metric of an error the daemon
// retries: the most telling reason (Named) among err's marks and its server error's
// SQLSTATE, else "connection". The labels are RetryReasons, each documented at its
// Reason.
func ReasonOf(err error) string {
	marks := Marks(err)
	if pgErr, ok := serverError(err); ok {
		marks = append(marks, ServerMark(pgErr))
	}
	if r := Named(marks); r != ReasonNone {
		return r.String()
	}
	return ReasonConnection.String()
}

// Hint returns advice for an operator about a failure the daemon retries, or "": the first hint
// among err's marks that decide alone (a statement past its deadline, a restart on purpose), then
// its server error's, which names a cause more closely than a mark that only backs off (a lost
// slot wrapping the refused row the session ended with), then those marks', then a failed
// connection attempt's.
func Hint(err error) string {
	marks := Marks(err)
	backOffs := slices.IndexFunc(marks, func(m Mark) bool { return m.Action == BackOff && !m.Overrides })
	if backOffs < 0 {
		backOffs = len(marks)
	}
	if pgErr, ok := serverError(err); ok {
		marks = slices.Insert(marks, backOffs, ServerMark(pgErr))
	}
	for _, m := range marks {
		if m.Hint != "" {
			return m.Hint
		}
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return "check that the server is running and that the URL's host, port and database are right"
	}
	return ""
}

// serverError returns the first server error err wraps.
func serverError(err error) (*pgconn.PgError, bool) {
	var pgErr *pgconn.PgError
	return pgErr, errors.As(err, &pgErr)
}

// ServerMark is the disposition of the server's error e by its SQLSTATE code (PostgreSQL docs
// Appendix A), else by its class (the code's first two characters); any other code stops the
// daemon (reason "other"). The codes and classes it backs off after are those after which the
// next session can succeed, once time or an operator fixed their cause.
func ServerMark(e *pgconn.PgError) Mark {
	retried := func(r Reason, hint string) Mark {
		return Mark{Action: BackOff, Reason: r, Hint: hint}
	}
	switch e.Code {
	case pgerrcode.ObjectInUse: // a replication slot still active
		return retried(ReasonSlotBusy, "another process holds the replication slot: a second pgconverge with the same --slot, or the walsender of a killed one that the source has not noticed yet (then it frees the slot within wal_sender_timeout)")
	case pgerrcode.LockNotAvailable: // a lock_timeout someone set
		return retried(ReasonLock, "a lock held by another session was not granted in time: the daemon retries; pg_locks on that server shows who holds it")
	case pgerrcode.UndefinedTable: // a target table dropped while streaming: the next session recreates and reloads it
		return retried(ReasonSchema, "a table is missing; if a target table was dropped, the next session recreates and reloads it")
	case pgerrcode.UndefinedColumn: // a column dropped or renamed on the source while a load read it
		return retried(ReasonSchema, "a column was dropped or renamed on the source while it was read: the next session describes the table again")
	case pgerrcode.DependentObjectsStillExist: // objects of the operator's on a target column pgconverge must drop
		return retried(ReasonSchema, "objects on the target ("+e.Detail+") depend on a target column, table or live view that pgconverge must drop to follow a change of the source (most likely a column the source dropped and added again): drop or change them; the daemon retries meanwhile")
	case pgerrcode.IdleInTransactionSessionTimeout: // a publication change committed too late (cdc.PublishHooks.CommitWithin)
		return retried(ReasonOther, "")
	case pgerrcode.DiskFull:
		return retried(ReasonResources, "a disk of the server that reported it is full (the error names the file): free space or grow the filesystem there; nothing was committed from the failed transaction, and the daemon retries the same changes until it succeeds")
	}
	if len(e.Code) != 5 {
		return Mark{Action: Stop, Reason: ReasonOther}
	}
	switch e.Code[:2] {
	case "23": // integrity constraint violation: the batch is never skipped, it is tried again until the constraint is changed
		if strings.HasPrefix(e.TableName, "pgconverge_stage") {
			return retried(ReasonConstraint, "pgconverge's staging copy of a target table refused a row, most likely a change of the source without a value for a key column; this is no constraint of yours: report it with this log line, the daemon retries meanwhile")
		}
		return retried(ReasonConstraint, "a constraint of the target table rejects a row of the source (the error names the constraint and the row): change or drop that constraint on the target; the daemon retries the same changes until then and never skips them")
	case "08", "57": // connection exception; operator intervention (a server shutting down or starting)
		return retried(ReasonConnection, "")
	case "40": // transaction rollback (serialization failure, deadlock)
		if e.Code == pgerrcode.SerializationFailure {
			// What a standby reports when it cancels a query in conflict with recovery (PostgreSQL
			// docs §26.4.2 "Handling Query Conflicts"); pgconverge's own reads never serialize.
			return retried(ReasonConflict, "a serialization failure: on a standby source, the standby cancelled a read that held back its replay of the primary's WAL longer than max_standby_streaming_delay (a lock or a VACUUM on the primary); the daemon retries and a backfill resumes from its last chunk; for long loads raise max_standby_streaming_delay on the standby")
		}
		return retried(ReasonConflict, "")
	case "53": // insufficient resources
		return retried(ReasonResources, "the server that reported it lacks a resource (memory, connections, disk): the error names it; the daemon retries the same changes")
	case "58": // system error
		return retried(ReasonOther, "")
	}
	return Mark{Action: Stop, Reason: ReasonOther}
}

// ConnectionFailed reports whether err is a failure of the connection itself (it could not be
// opened, broke, timed out or was closed), not an answer of the server.
func ConnectionFailed(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed)
}
