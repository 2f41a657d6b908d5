package pgsession

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// ConnectError is a failed connection to the source or the target. Its message names the side,
// the address and the role, then the cause: the server's own error when a server answered (a
// refused TLS request tried first with sslmode=prefer is left out, as it is not the cause) with
// the fix for the usual ones, else each distinct network error of the addresses tried. Unwrap
// returns pgx's error (a *pgconn.ConnectError), so callers classify it by type and SQLSTATE.
type ConnectError struct {
	// Role is "source" or "target"; Addr is host:port/database; User the role connected as.
	Role, Addr, User string
	// Needs, when set, says what the connection needs beyond the usual (a replication
	// connection's REPLICATION attribute).
	Needs string
	err   error
}

// Error returns the failure as one line.
func (e *ConnectError) Error() string {
	needs := ""
	if e.Needs != "" {
		needs = " (" + e.Needs + ")"
	}
	return fmt.Sprintf("connect to %s %s as %q%s: %s", e.Role, e.Addr, e.User, needs, connectCause(e.err))
}

// Unwrap returns pgx's error.
func (e *ConnectError) Unwrap() error { return e.err }

// connectCause describes why pgx's connect error err happened (ConnectError).
func connectCause(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		msg := pgErr.Error()
		if fix := connectFix(pgErr.Code); fix != "" {
			msg += ": " + fix
		}
		return msg
	}
	// pgx joins the errors of the addresses and TLS modes it tried, one per line; the same
	// network error repeats for each TLS mode.
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		err = connectErr.Unwrap()
	}
	var causes []string
	for _, line := range strings.Split(err.Error(), "\n") {
		if line = strings.TrimSpace(line); line != "" && !slices.ContainsFunc(causes, func(c string) bool { return strings.HasSuffix(c, line) }) {
			causes = append(causes, line)
		}
	}
	return strings.Join(causes, "; ")
}

// connectFix returns the usual fix for a server's refusal of a connection with SQLSTATE code, or
// "" (PostgreSQL docs §21.1 "The pg_hba.conf File", §21.3 "Authentication Methods").
func connectFix(code string) string {
	switch code {
	case pgerrcode.InvalidPassword:
		return "check the password in the URL, PGPASSWORD or ~/.pgpass"
	case pgerrcode.InvalidAuthorizationSpecification:
		return "check the user name in the URL, and that pg_hba.conf allows this user from this host to this database"
	case pgerrcode.InvalidCatalogName:
		return "check the database name in the URL"
	case pgerrcode.TooManyConnections:
		return "the server has no connection slot left (max_connections): the daemon retries"
	case pgerrcode.CannotConnectNow:
		return "the server is starting or shutting down: the daemon retries"
	}
	return ""
}

// IsCode reports whether err wraps a server error (*pgconn.PgError) with SQLSTATE code
// (PostgreSQL docs, Appendix A).
func IsCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
