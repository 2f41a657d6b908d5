package engine

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/overlap"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

func TestRetryable(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("apply: %w", &pgconn.PgError{Code: code}) }
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"admin shutdown", pg("57P01"), true},
		{"connection failure", pg("08006"), true},
		{"disk full", pg("53100"), true},
		{"serialization failure", pg("40001"), true},
		{"slot active", pg("55006"), true},
		{"slot busy", fmt.Errorf("prepare: %w", cdc.ErrSlotBusy), true},
		{"lost connection", fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), true},
		{"target table dropped", pg("42P01"), true},
		{"undefined column: dropped on the source while a load read it", pg("42703"), true},
		{"objects of the operator's depend on a target column the source created again", pg("2BP01"), true},
		{"invalid text for a type", pg("22P02"), false},
		{"a target check constraint refuses a row", pg("23514"), true},
		{"a target unique index refuses a row", pg("23505"), true},
		{"lock not granted in time", pg("55P03"), true},
		{"cardinality violation", pg("21000"), false},
		{"permanent", permanent(errors.New("no primary key")), false},
		{"our own decoding error", errors.New("pgoutput: Commit does not match"), false},
		{"slot dropped before streaming started", fmt.Errorf("start replication: %w: %w", cdc.ErrSlotMissing, &pgconn.PgError{Code: "42704"}), true},
		{"publication dropped while the slot needed it", fmt.Errorf("stream: %w: %w", cdc.ErrPublicationMissing, &pgconn.PgError{Code: "42704"}), false},
		{"undefined object otherwise", pg("42704"), false},
		{"a failed catalog read of the watcher", watchError{pg("XX000")}, true},
		{"a refused value the enum labels could not be checked for", enumCheckError{pg("22P02")}, true},
		{"a replicated table lost its key", keyLostError{errors.New("table public.t has no primary key")}, true},
		{"slot invalidated while the session used it", fmt.Errorf("%w: (start replication: %w)", errSlotLost, &pgconn.PgError{Code: "55000"}), true},
		{"membership changed", fmt.Errorf("%w for table public.t", errMembershipChanged), true},
		{"a table the running daemon of another slot follows", fmt.Errorf("record coverage: %w", overlap.FollowedElsewhereError{}), true},
		{"a statement past its deadline", fmt.Errorf("%w (%w)", &pgsession.TimeoutError{Role: "source", Timeout: time.Minute}, io.ErrUnexpectedEOF), true},
		{"a statement past its deadline, then a refusal on its closed connection", fmt.Errorf("%w (%w)", &pgsession.TimeoutError{Role: "target", Timeout: time.Minute}, permanent(errors.New("check"))), true},
	}
	for _, c := range cases {
		if got := retryable(c.err); got != c.want {
			t.Errorf("%s: retryable = %v, want %v", c.name, got, c.want)
		}
		if r := reason(c.err); c.want && !slices.Contains(RetryReasons(), r) {
			t.Errorf("%s: reason %q is not among RetryReasons() %v, whose metric series exist from the start", c.name, r, RetryReasons())
		}
	}
}

// A check that refuses what only an operator can change stops the daemon; one that could not run
// because its connection broke or its server was shutting down is retried (the soak once cut the
// source while the session read its settings, and the daemon exited).
func TestRefusalOfACheckThatCouldNotRun(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"a refusal", errors.New("source wal_level is \"replica\""), false},
		{"a refusal with a server error", fmt.Errorf("read: %w", &pgconn.PgError{Code: "42501"}), false},
		{"refusals joined", errors.Join(errors.New("table a has no key"), errors.New("table b has no key")), false},
		{"connection reset while reading settings", fmt.Errorf("read source settings: %w", reset), true},
		{"lost connection among refusals", errors.Join(errors.New("table a has no key"), fmt.Errorf("describe b: %w", io.ErrUnexpectedEOF)), true},
		{"server shutting down", fmt.Errorf("read: %w", &pgconn.PgError{Code: "57P01"}), true},
	}
	for _, c := range cases {
		if got := retryable(refusal(c.err)); got != c.want {
			t.Errorf("%s: retryable = %v, want %v", c.name, got, c.want)
		}
	}
}
