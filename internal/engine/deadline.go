package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// statementTimeout bounds each statement of a session's start (its checks, the metadata schema,
// the leader's epoch, the ledger's bookkeeping, the publication, the slot's reads and
// START_REPLICATION), of its periodic catalog checks while it streams and of its reads of the
// ledger, and the opening of each connection among them (pgsession.Deadline): a source or target
// that stops answering behind a connection that stays open (a frozen host or proxy, a network
// that drops packets, which TCP keepalives do not see while the peer's kernel still acknowledges)
// fails the session, which is retried with backoff, instead of holding it forever. Each of those
// statements takes well under a second on a server that answers; the longest wait among them is
// a new leader's for the transactions of the previous one, which ends them after lease.Term. Not
// bounded: the loads (COPY), the stream's applies, a target table's reshape (which may rewrite
// it) and the lock that serialises reshapes, and the creation of a slot (which waits for the
// source's running transactions).
const statementTimeout = time.Minute

// newDeadline returns the session's statement deadline: statementTimeout, or
// Knobs.StatementTimeout when set.
func (c *Config) newDeadline() *pgsession.Deadline {
	d := statementTimeout
	if c.Knobs.StatementTimeout > 0 {
		d = c.Knobs.StatementTimeout
	}
	return pgsession.NewDeadline(d)
}

// bounded returns ctx under which each statement gets the session's statement deadline.
func (s *session) bounded(ctx context.Context) context.Context { return s.deadline.Bound(ctx) }

// step runs Knobs.BeforeStep, when set, before the session's step name.
func (s *session) step(name string) {
	if s.cfg.Knobs.BeforeStep != nil {
		s.cfg.Knobs.BeforeStep(name)
	}
}

// timedOut returns err, the session's error, joined after the statement deadline that passed
// first in the session, if one did and err does not name it already: its connection was closed,
// which explains what failed after it.
func (s *session) timedOut(err error) error {
	var te *pgsession.TimeoutError
	if exp := s.deadline.Expired(); exp != nil && !errors.As(err, &te) {
		return fmt.Errorf("%w (%w)", exp, err)
	}
	return err
}
