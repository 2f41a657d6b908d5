package main

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/cdc"
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

// retryable reports whether err is a transient failure of the source or target (a lost or refused
// connection, a server shutting down or starting, lack of resources such as a full disk, a
// serialization failure, a slot still held by a dead session) after which the daemon reconnects.
func retryable(err error) bool {
	var perm permanentError
	if errors.As(err, &perm) {
		return false
	}
	// A load stopped by a source table rewrite resumes from a new snapshot in the next session.
	if restartNow(err) || errors.Is(err, cdc.ErrSlotBusy) || errors.Is(err, backfill.ErrRewritten) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "40", "53", "57", "58":
			return true
		}
		// 55006: object in use (a replication slot still active); 42P01: a target table dropped
		// while streaming, which the next session recreates and reloads.
		// 42704 for a replication slot: it was dropped; the next session records the gap and
		// creates it anew.
		// 42703: a column dropped or renamed on the source while a load read it; the next
		// session describes the table again.
		// 22P02 for an enum: a label added on the source while streaming, which the next
		// session adds on the target (ensureTypes).
		return pgErr.Code == "55006" || pgErr.Code == "42P01" || pgErr.Code == "42703" || enumLabelMissing(err) ||
			pgErr.Code == "42704" && strings.Contains(pgErr.Message, "replication slot")
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed)
}

// restartNow reports whether err ends a session on purpose, for the next one to pick up a change
// on the source (publication membership, the slot, a table's columns): the daemon restarts at
// once, without backing off.
func restartNow(err error) bool {
	var schema *cdc.SchemaChangeError
	return errors.Is(err, errMembershipChanged) || errors.Is(err, errSlotMoved) || errors.Is(err, errEnumChanged) ||
		errors.As(err, &schema)
}

// enumLabelMissing reports whether err is the target refusing an enum label the source added
// since the session started: the next session adds it (ensureTypes), so it is routine.
func enumLabelMissing(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, "invalid input value for enum")
}

// hint returns advice for an operator about a transient failure, or "".
func hint(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" {
		return "another process holds the replication slot: a second pgconverge with the same --slot, or the walsender of a killed one that the source has not noticed yet (then it frees the slot within wal_sender_timeout)"
	}
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return "a table is missing; if a target table was dropped, the next session recreates and reloads it"
	}
	if errors.As(err, &pgErr) && pgErr.Code == "42703" {
		return "a column was dropped or renamed on the source while it was read: the next session describes the table again"
	}
	if errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, "for enum") {
		return "an enum label was added on the source: the next session adds it to the target's type"
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return "check that the server is running and that the URL's host, port and database are right"
	}
	return ""
}
