package changebatch

import (
	"fmt"

	"github.com/jackc/pglogrepl"
)

// Version orders changes of one key: (LSN, Seq) compared lexicographically (docs/design.md, "The
// version rule"). A streamed change has the commit LSN of its transaction and its ordinal in it
// (1..n); a snapshot row has the snapshot LSN S and Seq 0.
type Version struct {
	LSN pglogrepl.LSN
	Seq uint64
}

// Compare returns -1, 0 or +1 as v is older than, equal to or newer than o.
func (v Version) Compare(o Version) int {
	switch {
	case v.LSN < o.LSN:
		return -1
	case v.LSN > o.LSN:
		return 1
	case v.Seq < o.Seq:
		return -1
	case v.Seq > o.Seq:
		return 1
	}
	return 0
}

// String prints the version as "X/Y#seq".
func (v Version) String() string { return fmt.Sprintf("%s#%d", v.LSN, v.Seq) }

// Op is the operation of one row of a change batch.
type Op uint8

// The operations a batch row can carry.
const (
	// OpUpsert carries the row image after an INSERT or UPDATE, or a snapshot row.
	OpUpsert Op = 'U'
	// OpDelete carries the key of a deleted row; it becomes a tombstone.
	OpDelete Op = 'D'
	// OpTruncate fences the whole table at the row's version; its data columns are NULL.
	OpTruncate Op = 'T'
)

// Value is one column value of a change in PostgreSQL text format.
type Value struct {
	Text string
	// Null is true for SQL NULL.
	Null bool
	// Unchanged is true when the source did not send the value (pgoutput 'u': an unchanged
	// TOASTed value); Text is then empty.
	Unchanged bool
}

// Change is one row change as a producer appends it: Values align with Table.Columns.
type Change struct {
	Op      Op
	Version Version
	Values  []Value
	// Occurrence identifies a snapshot row of a keyless table among the rows of its snapshot
	// (its ctid as block<<16 | offset), so that a row read twice at one snapshot is written once;
	// 0 otherwise.
	Occurrence uint64
}

func lsnOf(u uint64) pglogrepl.LSN { return pglogrepl.LSN(u) }
