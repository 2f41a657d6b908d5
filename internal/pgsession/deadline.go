package pgsession

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/disposition"
)

// Deadline gives every statement run under a context it bounds (Bound), on a connection opened by
// Connect, a deadline of its own, and every connection opened under such a context (Connect,
// ConnectReplication) one too. A server or network that stops answering behind a connection that
// stays open (a frozen host or proxy, a network that drops packets, which TCP keepalives do not
// see while the peer's kernel still acknowledges) then fails the statement when its deadline
// passes, and pgx closes the connection: a server-side statement_timeout cannot, as the server
// never hears of the statement. The statements of a whole phase are bounded by one Bound, each
// on its own, so a phase with many short statements is never cut for being long; statements that
// may rightly run long (a load's COPY, a reshape that rewrites a table) run under Unbound. A
// Deadline is safe for concurrent use.
type Deadline struct {
	timeout time.Duration
	expired atomic.Pointer[TimeoutError]
}

// NewDeadline returns a Deadline of timeout for each statement (timeout > 0).
func NewDeadline(timeout time.Duration) *Deadline { return &Deadline{timeout: timeout} }

// TimeoutError is a statement, or the opening of a connection, that got no answer from Role
// ("source" or "target") within Timeout.
type TimeoutError struct {
	Role    string
	Timeout time.Duration
}

// Mark says that the daemon backs off and reconnects (reason "timeout") whatever else the error
// holds (Overrides): the connection the statement ran on is closed, so what failed after it
// failed on that.
func (e *TimeoutError) Mark() disposition.Mark {
	return disposition.Mark{
		Action:    disposition.BackOff,
		Reason:    disposition.ReasonTimeout,
		Overrides: true,
		Hint:      "the " + e.Role + " stopped answering behind an open connection (a frozen host or proxy, or a network that drops packets, which TCP keepalives do not notice while the peer's kernel still acknowledges), or a statement waited that long for a lock (pg_locks on the " + e.Role + " shows who holds it): the daemon reconnects; check the network between this host and the " + e.Role,
	}
}

// Error says which server did not answer, within what, and the likely causes.
func (e *TimeoutError) Error() string {
	return fmt.Sprintf("the %s gave no answer to a statement within %s (a frozen host or proxy, or a network that drops packets)", e.Role, e.Timeout)
}

type deadlineKey struct{}

// Bound returns ctx under which each statement and each connection opening gets d's deadline.
func (d *Deadline) Bound(ctx context.Context) context.Context {
	return context.WithValue(ctx, deadlineKey{}, d)
}

// Unbound returns ctx without the Deadline that Bound gave it, for statements that may rightly
// run long.
func Unbound(ctx context.Context) context.Context {
	return context.WithValue(ctx, deadlineKey{}, (*Deadline)(nil))
}

// Expired returns the first statement or connection opening under d whose deadline passed, as a
// *TimeoutError, or nil: the connection it ran on is closed, so whatever failed on it after is
// explained by it.
func (d *Deadline) Expired() error {
	if e := d.expired.Load(); e != nil {
		return e
	}
	return nil
}

// Call returns ctx with the deadline of the Deadline it carries (Bound), for one call to role's
// server that is no statement of a Connect connection (a replication command), and the func to
// call once it answered, which records an expiry; ctx and a no-op when ctx carries none.
func Call(ctx context.Context, role string) (context.Context, func()) {
	d, _ := ctx.Value(deadlineKey{}).(*Deadline)
	if d == nil {
		return ctx, func() {}
	}
	cause := &TimeoutError{Role: role, Timeout: d.timeout}
	cctx, cancel := context.WithTimeoutCause(ctx, d.timeout, cause)
	return cctx, func() {
		if errors.Is(context.Cause(cctx), cause) {
			d.expired.CompareAndSwap(nil, cause)
		}
		cancel()
	}
}

// tracer bounds the statements of one connection to role's server (Deadline): each starts with
// Call, each end calls the func Call returned.
type tracer struct{ role string }

type endKey struct{}

func (t tracer) start(ctx context.Context) context.Context {
	cctx, end := Call(ctx, t.role)
	return context.WithValue(cctx, endKey{}, end)
}

func (tracer) end(ctx context.Context) {
	if end, ok := ctx.Value(endKey{}).(func()); ok {
		end()
	}
}

func (t tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return t.start(ctx)
}

func (t tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) { t.end(ctx) }

func (t tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return t.start(ctx)
}

func (tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t tracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) { t.end(ctx) }

func (t tracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return t.start(ctx)
}

func (t tracer) TracePrepareEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareEndData) {
	t.end(ctx)
}
