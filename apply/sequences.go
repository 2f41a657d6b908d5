package apply

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Sequence is a source sequence as SyncSequence needs it: its name, CREATE SEQUENCE parameters
// (PostgreSQL docs, CREATE SEQUENCE) and state. The producer side reads it (cdc.ReadSequence).
type Sequence struct {
	Schema, Name string
	// DataType is smallint, integer or bigint.
	DataType string
	// Start, Increment, Min, Max and Cache are START WITH, INCREMENT BY (negative: descending),
	// MINVALUE, MAXVALUE and CACHE; Cycle is CYCLE.
	Start, Increment, Min, Max, Cache int64
	Cycle                             bool
	// Value is the source's last_value and is_called.
	Value SequenceValue
}

// SequenceValue is a sequence's last_value and is_called (the arguments of setval, PostgreSQL
// docs §9.17): with IsCalled the next nextval returns LastValue plus the increment, else LastValue.
type SequenceValue struct {
	LastValue int64
	IsCalled  bool
}

// String prints the value for people: "42", or "1 (not called)" when nextval would return it.
func (v SequenceValue) String() string {
	s := strconv.FormatInt(v.LastValue, 10)
	if !v.IsCalled {
		s += " (not called)"
	}
	return s
}

// SequenceAction is what SyncSequence did with a target sequence.
type SequenceAction string

const (
	// SequenceCreated: the sequence was missing on the target; it was created with the source's
	// parameters and set to the source's value.
	SequenceCreated SequenceAction = "created"
	// SequenceAdvanced: the target's sequence was behind the source's and was set to its value.
	SequenceAdvanced SequenceAction = "advanced"
	// SequenceEqual: the target's next value already was the source's.
	SequenceEqual SequenceAction = "unchanged"
	// SequenceKeptAhead: the target's next value was past the source's (higher, or lower for a
	// descending sequence) and was not moved back.
	SequenceKeptAhead SequenceAction = "kept (target ahead)"
)

// SequenceSync is the outcome of SyncSequence: the target's value before (nil when the sequence
// was missing) and after, and the action.
type SequenceSync struct {
	Before *SequenceValue
	After  SequenceValue
	Action SequenceAction
}

// SyncSequence makes the target's sequence s (same schema-qualified name) return, on its next
// nextval, a value past every value the source had handed out when s.Value was read: it creates
// the sequence with the source's parameters (and its schema) when missing, and sets it to s.Value
// with setval unless the target's next value is already at or past the source's. It never moves a
// target sequence back. The comparison and setval are two statements: a nextval on the target in
// between (which nothing does before the target is promoted) could be undone. Errors name the
// sequence and the privilege to grant (CREATE on the database or schema, SELECT and UPDATE on the
// sequence).
func SyncSequence(ctx context.Context, conn *pgx.Conn, s Sequence) (SequenceSync, error) {
	name := changebatch.QualifiedName(s.Schema, s.Name)
	quoted := pgx.Identifier{s.Schema, s.Name}.Sanitize()
	var out SequenceSync
	var kind *string
	if err := conn.QueryRow(ctx, `select c.relkind::text from pg_class c where c.oid = to_regclass($1)`, quoted).Scan(&kind); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return out, fmt.Errorf("look up target sequence %s: %w", name, err)
	}
	switch {
	case kind == nil:
		ddl, err := createSequenceSQL(s)
		if err != nil {
			return out, err
		}
		if _, err := conn.Exec(ctx, "create schema if not exists "+pgx.Identifier{s.Schema}.Sanitize()); err != nil {
			return out, fmt.Errorf("create schema %q for sequence %s on the target (the target role needs CREATE on the database): %w", s.Schema, name, err)
		}
		if _, err := conn.Exec(ctx, ddl); err != nil {
			return out, fmt.Errorf("create sequence %s on the target (the target role needs CREATE on schema %q): %w", name, s.Schema, err)
		}
		out.Action = SequenceCreated
	case *kind != "S":
		return out, fmt.Errorf("target relation %s is not a sequence (relkind %q): rename or drop it on the target so the sequence can be created", name, *kind)
	}
	cur, inc, err := readTargetSequence(ctx, conn, name, quoted)
	if err != nil {
		return out, err
	}
	if out.Action != SequenceCreated {
		out.Before = &cur
		if (inc > 0) != (s.Increment > 0) {
			return out, fmt.Errorf("target sequence %s has INCREMENT BY %d, the source's %d: they run in opposite directions; run ALTER SEQUENCE %s INCREMENT BY %d on the target",
				name, inc, s.Increment, quoted, s.Increment)
		}
		switch c := compareNext(cur, inc, s.Value, s.Increment); {
		case c == 0:
			out.After, out.Action = cur, SequenceEqual
			return out, nil
		case c > 0:
			out.After, out.Action = cur, SequenceKeptAhead
			return out, nil
		}
		out.Action = SequenceAdvanced
	}
	if _, err := conn.Exec(ctx, `select setval($1::regclass, $2, $3)`, quoted, s.Value.LastValue, s.Value.IsCalled); err != nil {
		return out, sequenceError(err, fmt.Sprintf("set target sequence %s to %s", name, s.Value), quoted)
	}
	if out.After, _, err = readTargetSequence(ctx, conn, name, quoted); err != nil {
		return out, err
	}
	return out, nil
}

// readTargetSequence returns the target sequence's value and increment.
func readTargetSequence(ctx context.Context, conn *pgx.Conn, name, quoted string) (SequenceValue, int64, error) {
	var v SequenceValue
	var inc int64
	err := conn.QueryRow(ctx, `select s.last_value, s.is_called, p.seqincrement from `+quoted+` s, pg_sequence p
where p.seqrelid = $1::regclass`, quoted).Scan(&v.LastValue, &v.IsCalled, &inc)
	if err != nil {
		return v, 0, sequenceError(err, "read target sequence "+name, quoted)
	}
	return v, inc, nil
}

// sequenceError wraps err of operation op on the target sequence quoted, naming the fix for a
// missing privilege or a value out of the sequence's range.
func sequenceError(err error, op, quoted string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case pgerrcode.InsufficientPrivilege:
			return fmt.Errorf("%s: run GRANT SELECT, UPDATE ON SEQUENCE %s TO <role> on the target: %w", op, quoted, err)
		case pgerrcode.NumericValueOutOfRange:
			return fmt.Errorf("%s: the value is outside the target sequence's range; run ALTER SEQUENCE %s with the source's AS type, MINVALUE and MAXVALUE on the target: %w", op, quoted, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// compareNext compares the next values nextval would return for a and b, each with its own
// increment, in the direction of the sequence (bInc's sign): it returns +1 when a's is ahead of
// b's (higher for an ascending sequence, lower for a descending one), 0 when they are equal and
// -1 when a's is behind. It computes in arbitrary precision: a next value may lie past int64.
func compareNext(a SequenceValue, aInc int64, b SequenceValue, bInc int64) int {
	next := func(v SequenceValue, inc int64) *big.Int {
		n := big.NewInt(v.LastValue)
		if v.IsCalled {
			n.Add(n, big.NewInt(inc))
		}
		return n
	}
	c := next(a, aInc).Cmp(next(b, bInc))
	if bInc < 0 {
		c = -c
	}
	return c
}

// createSequenceSQL returns the CREATE SEQUENCE statement for s with all its parameters spelled
// out (so the target's defaults play no part).
func createSequenceSQL(s Sequence) (string, error) {
	switch s.DataType {
	case "smallint", "integer", "bigint":
	default:
		return "", fmt.Errorf("sequence %s has data type %q: only smallint, integer and bigint are possible", changebatch.QualifiedName(s.Schema, s.Name), s.DataType)
	}
	var b strings.Builder
	b.WriteString("create sequence if not exists ")
	b.WriteString(pgx.Identifier{s.Schema, s.Name}.Sanitize())
	b.WriteString(" as " + s.DataType)
	b.WriteString(" increment by " + strconv.FormatInt(s.Increment, 10))
	b.WriteString(" minvalue " + strconv.FormatInt(s.Min, 10))
	b.WriteString(" maxvalue " + strconv.FormatInt(s.Max, 10))
	b.WriteString(" start with " + strconv.FormatInt(s.Start, 10))
	b.WriteString(" cache " + strconv.FormatInt(s.Cache, 10))
	if s.Cycle {
		b.WriteString(" cycle")
	} else {
		b.WriteString(" no cycle")
	}
	return b.String(), nil
}
