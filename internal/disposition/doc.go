// Package disposition marks an error, where it is born, with what the daemon does after a session
// ended with it: stop, back off and reconnect, or restart at once on purpose; with the reason that
// labels the session retry metric and a hint for the operator.
//
// Invariant: marking never changes an error. Its message stays the original one, and errors.Is and
// errors.As see through a mark to what it marks, so callers that branch on an error's identity are
// unaffected; only the daemon's retry decision reads marks (Marks).
//
// An error is marked in one of three ways: a sentinel is created marked (New); an error type
// carries its mark in a Mark method (Marker), which may depend on its fields; Wrap marks one
// error at the place that knows what it means (a refusal only an operator can lift). The idea is
// that of CockroachDB's changefeeds, which mark a terminal error at its origin instead of
// recognising it where it is handled, so a new failure mode is decided where it is written.
// Errors of the server are not marked: they are decided by their SQLSTATE (ServerMark, PostgreSQL
// docs, Appendix A, https://www.postgresql.org/docs/current/errcodes-appendix.html). Decide,
// ReasonOf and Hint apply these rules to the error a daemon's session ended with: a marked error
// follows its mark, a server error its SQLSTATE, a failed connection backs off, anything else
// stops.
package disposition
