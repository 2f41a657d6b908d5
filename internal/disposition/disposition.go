package disposition

import (
	"cmp"
	"errors"
	"slices"
)

// Action is what the daemon does after a session ended with an error.
type Action int

const (
	// Stop: retrying cannot fix it (bad configuration, an unusable source or target): the daemon
	// returns the error. A terminal error.
	Stop Action = iota
	// BackOff: a transient failure of the source or target: the daemon reconnects after an
	// exponential backoff.
	BackOff
	// Restart: the session ended on purpose, for the next one to pick up a change on the source
	// (publication membership, the slot, a table's columns, an enum's labels) or the slot's
	// leadership: the daemon starts the next session at once.
	Restart
)

// String returns "stop", "back off" or "restart".
func (a Action) String() string {
	switch a {
	case BackOff:
		return "back off"
	case Restart:
		return "restart"
	}
	return "stop"
}

// Reason names the kind of a failure, the label of the session retry metric. Reasons are declared
// from the most telling to the least: when an error holds several, the first names it (Named).
// A failed connection, for example, names the failure only when nothing more telling does.
type Reason int

const (
	// ReasonNone is a mark without a reason of its own: what the error wraps names it.
	ReasonNone Reason = iota
	// ReasonOverlap ("overlap"): a selected table is followed by the running daemon of another
	// slot.
	ReasonOverlap
	// ReasonLeadership ("leadership"): the daemon lost its leadership of the slot.
	ReasonLeadership
	// ReasonTimeout ("timeout"): a statement passed its deadline.
	ReasonTimeout
	// ReasonRestart ("restart"): another restart on purpose.
	ReasonRestart
	// ReasonWatch ("watch"): a catalog or WAL read of the watcher failed.
	ReasonWatch
	// ReasonSlotBusy ("slot-busy"): another process holds the replication slot.
	ReasonSlotBusy
	// ReasonSlotLost ("slot-lost"): the source invalidated the slot.
	ReasonSlotLost
	// ReasonSchema ("schema"): a table changed while it was read, or objects of the operator's
	// depend on what a schema change drops on the target.
	ReasonSchema
	// ReasonLock ("lock"): a lock was not granted in time.
	ReasonLock
	// ReasonConstraint ("constraint"): a constraint of the target refused a row.
	ReasonConstraint
	// ReasonConflict ("conflict"): a serialization failure or a deadlock.
	ReasonConflict
	// ReasonResources ("resources"): a server lacks a resource (a disk, memory, connections).
	ReasonResources
	// ReasonConnection ("connection"): a connection failed or its server is shutting down.
	ReasonConnection
	// ReasonOther ("other"): anything else.
	ReasonOther
)

// String returns the reason's metric label ("" for ReasonNone).
func (r Reason) String() string {
	switch r {
	case ReasonOverlap:
		return "overlap"
	case ReasonLeadership:
		return "leadership"
	case ReasonTimeout:
		return "timeout"
	case ReasonRestart:
		return "restart"
	case ReasonWatch:
		return "watch"
	case ReasonSlotBusy:
		return "slot-busy"
	case ReasonSlotLost:
		return "slot-lost"
	case ReasonSchema:
		return "schema"
	case ReasonLock:
		return "lock"
	case ReasonConstraint:
		return "constraint"
	case ReasonConflict:
		return "conflict"
	case ReasonResources:
		return "resources"
	case ReasonConnection:
		return "connection"
	case ReasonOther:
		return "other"
	}
	return ""
}

// Mark is an error's disposition: what the daemon does after it, why, and what an operator can do.
type Mark struct {
	Action Action
	// Reason names the failure (ReasonNone: what the error wraps names it).
	Reason Reason
	// Hint is advice for an operator, logged with a failure the daemon retries; "" when the
	// error says it all.
	Hint string
	// Overrides is set on a mark whose error explains whatever else an error holds: a statement
	// past its deadline closed its connection, so what failed after it failed on that. Its Action
	// wins over every other mark's.
	Overrides bool
}

// Marker is an error type marked at its definition: Mark returns its disposition, which may
// depend on the error's fields (a hint naming the server that did not answer).
type Marker interface {
	Mark() Mark
}

// marked is an error marked by New or Wrap.
type marked struct {
	err  error
	mark Mark
}

// Error returns the marked error's message, unchanged.
func (e *marked) Error() string { return e.err.Error() }

// Unwrap returns the marked error.
func (e *marked) Unwrap() error { return e.err }

// Mark returns the mark.
func (e *marked) Mark() Mark { return e.mark }

// New returns a sentinel error with message msg, marked m: every error wrapping it carries m,
// and errors.Is finds it as any sentinel.
func New(msg string, m Mark) error { return &marked{err: errors.New(msg), mark: m} }

// Wrap returns err marked m, or nil when err is nil. Its message is err's, and errors.Is and
// errors.As find err and what err wraps.
func Wrap(err error, m Mark) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, mark: m}
}

// Marks returns the marks err's tree holds (err and what it wraps, through Unwrap() error and
// Unwrap() []error), the one that decides first: a mark that Overrides, then those that Stop, then
// those that Restart, then those that BackOff; marks of equal strength by their reason, the most
// telling first and ReasonNone last, then in the order errors.As visits them (depth first, err
// before what it wraps). It returns nil for an unmarked error.
func Marks(err error) []Mark {
	var ms []Mark
	walk(err, func(e error) {
		if m, ok := e.(Marker); ok {
			ms = append(ms, m.Mark())
		}
	})
	slices.SortStableFunc(ms, func(a, b Mark) int {
		return cmp.Or(cmp.Compare(b.strength(), a.strength()), cmp.Compare(a.Reason.rank(), b.Reason.rank()))
	})
	return ms
}

// rank orders reasons for Marks and Named: the lower, the more telling; ReasonNone last.
func (r Reason) rank() int {
	if r == ReasonNone {
		return int(ReasonOther) + 1
	}
	return int(r)
}

// strength orders marks for Marks: the higher decides first.
func (m Mark) strength() int {
	switch {
	case m.Overrides:
		return 3
	case m.Action == Stop:
		return 2
	case m.Action == Restart:
		return 1
	}
	return 0
}

// walk calls f on err and on each error it wraps, depth first.
func walk(err error, f func(error)) {
	if err == nil {
		return
	}
	f(err)
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		walk(u.Unwrap(), f)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			walk(e, f)
		}
	}
}

// Named returns the most telling reason among ms (the first in the order Reasons are declared),
// or ReasonNone when none names one.
func Named(ms []Mark) Reason {
	best := ReasonNone
	for _, m := range ms {
		if m.Reason.rank() < best.rank() {
			best = m.Reason
		}
	}
	return best
}
