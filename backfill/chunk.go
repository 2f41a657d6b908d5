package backfill

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Chunk is the key range (Lower, Upper] of a table in the order of its key's index: key column
// values in text form, in changebatch.Table.KeyOrder; a nil bound is unbounded. The chunks of a
// plan are disjoint and together cover every possible key, whatever rows a later snapshot shows.
//
// A chunk of a block plan (ByBlock, NewBlockPlanner) is instead the rows stored in blocks
// [Lower, Upper) of the table's file: one block number each, in decimal; Upper nil is unbounded.
// Its chunks cover every row of one snapshot, read in no particular order.
//
// Limit, when above 0, reads only the first Limit rows of a key range, in key order: a long chunk
// read in parts, each part continuing after the last key the one before read (not for block
// chunks).
type Chunk struct {
	Lower, Upper []string
	ByBlock      bool
	Limit        int
}

// String renders the range for logs, for example (100, 200], ((x, 1), (x, 3)], (-inf, +inf) or
// blocks [0, 4096).
func (c Chunk) String() string {
	if c.ByBlock {
		upper := "+inf"
		if c.Upper != nil {
			upper = c.Upper[0]
		}
		return "blocks [" + strings.Join(c.Lower, "") + ", " + upper + ")"
	}
	b := func(k []string, inf string) string {
		switch len(k) {
		case 0:
			return inf
		case 1:
			return k[0]
		}
		return "(" + strings.Join(k, ", ") + ")"
	}
	return "(" + b(c.Lower, "-inf") + ", " + b(c.Upper, "+inf") + "]"
}

// keyColumns returns t's key columns, quoted, and their types, in KeyOrder.
func keyColumns(t changebatch.Table) (names, types []string) {
	for _, i := range t.KeyOrder() {
		names = append(names, pgx.Identifier{t.Columns[i].Name}.Sanitize())
		types = append(types, t.Columns[i].Type)
	}
	return names, types
}

// KeyColumnNames returns the names of t's key columns in KeyOrder, as a plan records them: a plan
// can only be resumed with the same key.
func KeyColumnNames(t changebatch.Table) []string {
	var out []string
	for _, i := range t.KeyOrder() {
		out = append(out, t.Columns[i].Name)
	}
	return out
}

// rangeCondition returns the SQL condition for c over t's key, comparing rows of the key columns
// with the bounds cast to the key types, so the comparison uses the key's own operators and
// collations (never Go's string order) and the key's index; and it returns the bounds as
// arguments numbered from $1. It returns "true" for an unbounded chunk.
func rangeCondition(t changebatch.Table, c Chunk) (string, []any) {
	var args []any
	cond := boundsCondition(t, c, func(v string) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	})
	return cond, args
}

// boundsCondition returns c's range over t's key columns (or its blocks) as SQL, each bound value
// written as value renders it (a parameter or a literal), cast to its column's type.
func boundsCondition(t changebatch.Table, c Chunk, value func(string) string) string {
	if c.ByBlock {
		return blockCondition(c, value)
	}
	names, types := keyColumns(t)
	var conds []string
	bound := func(k []string, op string) {
		if k == nil {
			return
		}
		ps := make([]string, len(k))
		for i, v := range k {
			ps[i] = value(v) + "::" + types[i]
		}
		conds = append(conds, "("+strings.Join(names, ", ")+") "+op+" ("+strings.Join(ps, ", ")+")")
	}
	bound(c.Lower, ">")
	bound(c.Upper, "<=")
	if len(conds) == 0 {
		return "true"
	}
	return strings.Join(conds, " and ")
}

// checkBounds returns an error when a bound of c does not have one value per key column of t, or,
// for a block chunk, is not one block number (Lower is required).
func checkBounds(t changebatch.Table, c Chunk) error {
	if c.ByBlock {
		if _, err := parseBlock(c.Lower); err != nil {
			return fmt.Errorf("chunk %s of %s: %w", c, t, err)
		}
		if c.Upper != nil {
			if _, err := parseBlock(c.Upper); err != nil {
				return fmt.Errorf("chunk %s of %s: %w", c, t, err)
			}
		}
		return nil
	}
	n := len(t.KeyOrder())
	if (c.Lower != nil && len(c.Lower) != n) || (c.Upper != nil && len(c.Upper) != n) {
		return fmt.Errorf("chunk %s of %s: a bound does not have %d key values", c, t, n)
	}
	return nil
}

// beginSnapshot starts a REPEATABLE READ, READ ONLY transaction on conn that imports snap.
func beginSnapshot(ctx context.Context, conn *pgx.Conn, snap Snapshot) (pgx.Tx, error) {
	if !snapshotName.MatchString(snap.Name) {
		return nil, fmt.Errorf("snapshot id %q is not a PostgreSQL snapshot id", snap.Name)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("begin a snapshot transaction: %w", err)
	}
	if _, err := tx.Exec(ctx, "set transaction snapshot '"+snap.Name+"'"); err != nil {
		tx.Rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("import snapshot %s (at %s): %w", snap.Name, snap.LSN, err)
	}
	return tx, nil
}
