package tableschema

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Pass is a part of what Carry carries, in the order a caller carries them over every table.
type Pass int

// Carry's passes.
const (
	// PassObjects carries everything but foreign keys, owners and grants.
	PassObjects Pass = iota
	// PassForeignKeys carries the foreign keys, which may reference a unique constraint of
	// another table, carried in its PassObjects.
	PassForeignKeys
	// PassOwnership carries the owner and grants (CompareOptions.Ownership), after which
	// pgconverge's role may not alter the table any more.
	PassOwnership
)

// Passes returns Carry's passes in the order a caller runs each over every table.
func Passes() []Pass { return []Pass{PassObjects, PassForeignKeys, PassOwnership} }

// passes maps each phase past the objects' to its pass.
var passes = map[int]Pass{phaseForeignKey: PassForeignKeys, phaseOwnership: PassOwnership}

// CarryOptions say what Carry runs.
type CarryOptions struct {
	Pass Pass
	// Rehearse leaves out the statements that only take time and cannot fail on rows the source
	// holds too (Difference.slow: index builds, VALIDATE CONSTRAINT). Run in a transaction
	// rolled back after, it shows that the rest (a trigger's function, a referenced table, an
	// expression's type, a role) works on the target.
	Rehearse bool
}

// Carry makes a target table's schema objects the source's on tx: it runs the Fix of each
// difference of diffs (Compare's, of one table) that it carries, in diffs' order, and returns
// those it carried. It carries NOT NULL, defaults, identities, constraints, indexes, triggers and
// comments (and, when compared, the owner and grants), the pass opts select. It leaves what only the target has (TargetOnly) and the columns
// and types, which the stream keeps.
//
// An identity whose sequence the target has as a plain sequence (cutover's sequence sync made it)
// takes that sequence's name and position: the plain sequence is dropped, the identity made
// with its name, and set to the position it had.
//
// A statement's error names the object and the fix; tx is then aborted.
func Carry(ctx context.Context, tx pgx.Tx, diffs []Difference, opts CarryOptions) ([]Difference, error) {
	var carried []Difference
	for _, d := range diffs {
		if d.TargetOnly || d.phase == phaseNone || d.phase == phaseSequence || d.phase == phasePartition || passes[d.phase] != opts.Pass {
			continue
		}
		restore, err := freeIdentitySequence(ctx, tx, d)
		if err != nil {
			return carried, err
		}
		for _, stmt := range append(d.Fix, restore...) {
			if opts.Rehearse && d.slow[stmt] {
				continue
			}
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return carried, fmt.Errorf("carry %s %s of table %s over to the target (%s): %w; create what it needs on the target (a role, function, type or referenced table the source has) or remove what stands in its way, then run cutover --finalize again: it goes on from here",
					d.Kind, d.Object, d.Table, stmt, err)
			}
		}
		carried = append(carried, d)
	}
	return carried, nil
}

// freeIdentitySequence drops the plain target sequence that carrying identity d would collide
// with, and returns the statement that gives the new identity sequence its position. For other
// differences, and where the target has no such sequence, it does nothing.
func freeIdentitySequence(ctx context.Context, tx pgx.Tx, d Difference) ([]string, error) {
	if d.Kind != KindIdentity || d.sequence == "" {
		return nil, nil
	}
	var exists bool
	if err := tx.QueryRow(ctx, `select to_regclass($1) is not null`, d.sequence).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look up sequence %s on the target: %w", d.sequence, err)
	}
	if !exists {
		return nil, nil
	}
	var last int64
	var called bool
	err := tx.QueryRow(ctx, "select last_value, is_called from "+d.sequence).Scan(&last, &called)
	if err != nil {
		return nil, fmt.Errorf("read sequence %s on the target: %w", d.sequence, err)
	}
	if _, err := tx.Exec(ctx, "drop sequence "+d.sequence); err != nil {
		return nil, fmt.Errorf("drop plain sequence %s on the target for the identity of %s.%s (something else uses it: drop that first): %w",
			d.sequence, d.Table, d.Object, err)
	}
	return []string{fmt.Sprintf("select setval(%s, %d, %t)", changebatch.QuoteLiteral(d.sequence), last, called)}, nil
}
