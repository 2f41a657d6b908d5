package tableschema

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Kinds of Difference.
const (
	KindColumn       = "column"
	KindType         = "type"
	KindNotNull      = "not null"
	KindDefault      = "default"
	KindIdentity     = "identity"
	KindGenerated    = "generated"
	KindConstraint   = "constraint"
	KindIndex        = "index"
	KindTrigger      = "trigger"
	KindTriggerState = "trigger state"
	KindComment      = "comment"
	KindSequence     = "sequence"
	KindPartitioning = "partitioning"
	KindOwner        = "owner"
	KindGrant        = "grant"
)

// Difference is one object whose target state is not the source's.
type Difference struct {
	Table changebatch.TableName `json:"table"`
	// Kind is one of the Kind constants; Object names the column, constraint, index or trigger
	// ("" for the table's own comment).
	Kind   string `json:"kind"`
	Object string `json:"object"`
	// Source and Target are the object's definition on each side, "" where it is missing.
	Source string `json:"source"`
	Target string `json:"target"`
	// Fix are the statements that make the target's object the source's, in order.
	Fix []string `json:"fix"`
	// Pending marks a difference of a table still replicated that cutover --finalize removes
	// (constraints, defaults, triggers and the like are carried over only then): not a fault.
	Pending bool `json:"pending,omitempty"`
	// TargetOnly marks an object only the target has: Carry leaves it, the fix drops it.
	TargetOnly bool `json:"target_only,omitempty"`
	// sequence is the identity sequence an identity difference makes, quoted.
	sequence string
	// slow are the statements of Fix that only take time and cannot fail on rows the source
	// holds too (an index build, a VALIDATE CONSTRAINT, a move of rows): a rehearsal leaves
	// them out (CarryOptions.Rehearse).
	slow map[string]bool
	// phase orders Carry's statements: a NOT NULL before the identity that needs it, a unique
	// constraint before the foreign keys that reference it.
	phase int
}

// Carry's phases: the columns' properties, the table's constraints and indexes, its triggers and
// comments; foreign keys after every table's (phaseForeignKey); the owner and grants last, once
// pgconverge's role needs the table no more (phaseOwnership).
const (
	phasePartition = iota + 1 // Repartition runs it, before the rest is compared anew
	phaseNotNull
	phaseDefault
	phaseIdentity
	phaseConstraint
	phaseIndex
	phaseTrigger
	phaseComment
	phaseForeignKey
	phaseOwnership
	phaseSequence // pgconverge sequences and cutover sync them; Carry does not
	phaseNone     // differences Carry does not fix: the stream keeps columns and types
)

// CompareOptions say how Compare compares.
type CompareOptions struct {
	// Replicating says the target table is still one pgconverge replicates into (it has _cdc_
	// columns): what only cutover --finalize carries over is then Pending.
	Replicating bool
	// Ownership compares the tables' owners and grants too (the roles must exist on both
	// sides); off, a target table owned by pgconverge's role is no difference.
	Ownership bool
}

// Compare returns the differences between table src (the source's) and tgt (the target's of the
// same name), in Carry's order.
func Compare(src, tgt Schema, opts CompareOptions) []Difference {
	replicating := opts.Replicating
	c := comparison{t: src.Table}
	if opts.Ownership {
		c.ownership(src, tgt)
	}
	c.partitioning(src, tgt)
	c.columns(src.Columns, tgt.Columns)
	c.comment("", src.Comment, tgt.Comment, "comment on table "+src.Table.Quoted())
	c.constraints(src.Constraints, tgt.Constraints)
	c.indexes(src.Indexes, tgt.Indexes)
	c.triggers(src.Triggers, tgt.Triggers)
	if replicating {
		for i, d := range c.out {
			d.Pending = d.phase != phaseNone && !(d.Kind == KindIndex && !uniqueIndex(src.Indexes, d.Object))
			c.out[i] = d
		}
	}
	sort.SliceStable(c.out, func(i, j int) bool { return c.out[i].phase < c.out[j].phase })
	return c.out
}

// uniqueIndex reports whether the source's index name is unique (built only at finalize).
func uniqueIndex(idx []Index, name string) bool {
	for _, i := range idx {
		if i.Name == name {
			return i.Unique
		}
	}
	return false
}

type comparison struct {
	t   changebatch.TableName
	out []Difference
}

func (c *comparison) add(d Difference) {
	d.Table = c.t
	c.out = append(c.out, d)
}

// alter returns "alter table <t> " followed by the formatted rest.
func (c *comparison) alter(format string, args ...any) string {
	return "alter table " + c.t.Quoted() + " " + fmt.Sprintf(format, args...)
}

func q(name string) string { return pgx.Identifier{name}.Sanitize() }

// fixSlowly appends stmt to d's Fix as a statement that only takes time (Difference.slow).
func (d *Difference) fixSlowly(stmt string) {
	if d.slow == nil {
		d.slow = map[string]bool{}
	}
	d.slow[stmt] = true
	d.Fix = append(d.Fix, stmt)
}

// pair calls both(s, t, found) for each of src's objects with the target's object of the same
// key (the zero T and false when the target has none), then only(t) for each target object that
// no source object matched, in tgt's order.
func pair[T any, K comparable](src, tgt []T, key func(T) K, both func(s, t T, found bool), only func(t T)) {
	have := map[K]T{}
	for _, t := range tgt {
		have[key(t)] = t
	}
	for _, s := range src {
		t, ok := have[key(s)]
		delete(have, key(s))
		both(s, t, ok)
	}
	for _, t := range tgt {
		if _, ok := have[key(t)]; ok {
			only(t)
		}
	}
}

func (c *comparison) columns(src, tgt []Column) {
	pair(src, tgt, func(c Column) string { return c.Name }, func(s, t Column, found bool) {
		if !found {
			c.add(Difference{Kind: KindColumn, Object: s.Name, Source: s.Type, phase: phaseNone,
				Fix: []string{c.alter("add column %s %s", q(s.Name), s.Type)}})
			return
		}
		c.column(s, t)
	}, func(t Column) {
		c.add(Difference{Kind: KindColumn, Object: t.Name, Target: t.Type, TargetOnly: true, phase: phaseNone,
			Fix: []string{c.alter("drop column %s", q(t.Name))}})
	})
}

// column compares the properties of column s and t of the same name.
func (c *comparison) column(s, t Column) {
	col := q(s.Name)
	if s.Type != t.Type {
		c.add(Difference{Kind: KindType, Object: s.Name, Source: s.Type, Target: t.Type, phase: phaseNone,
			Fix: []string{c.alter("alter column %s type %s using %s::%s", col, s.Type, col, s.Type)}})
	}
	if s.Generated != t.Generated {
		c.add(Difference{Kind: KindGenerated, Object: s.Name, Source: s.Generated, Target: t.Generated, phase: phaseNone,
			Fix: []string{c.alter("drop column %s", col) + ", add column " + col + " " + s.Type + " generated always as (" + s.Generated + ") stored"}})
	}
	if s.NotNull != t.NotNull {
		set := map[bool]string{true: "set not null", false: "drop not null"}
		c.add(Difference{Kind: KindNotNull, Object: s.Name, Source: fmt.Sprint(s.NotNull), Target: fmt.Sprint(t.NotNull), phase: phaseNotNull,
			Fix: []string{c.alter("alter column %s %s", col, set[s.NotNull])}})
	}
	if s.Default != t.Default && s.Identity == 0 {
		d := Difference{Kind: KindDefault, Object: s.Name, Source: s.Default, Target: t.Default, phase: phaseDefault,
			Fix: []string{c.alter("alter column %s set default %s", col, s.Default)}}
		if s.Default == "" {
			d.TargetOnly, d.Fix = true, []string{c.alter("alter column %s drop default", col)}
		}
		c.add(d)
	}
	c.identity(s, t)
	c.comment(s.Name, s.Comment, t.Comment, "comment on column "+c.t.Quoted()+"."+col)
}

var identityKinds = map[byte]string{'a': "always", 'd': "by default"}

func (c *comparison) identity(s, t Column) {
	if s.Identity == t.Identity {
		return
	}
	col := q(s.Name)
	d := Difference{Kind: KindIdentity, Object: s.Name, Source: identityKinds[s.Identity], Target: identityKinds[t.Identity], phase: phaseIdentity}
	switch {
	case s.Identity == 0:
		d.TargetOnly, d.Fix = true, []string{c.alter("alter column %s drop identity", col)}
	case t.Identity == 0:
		d.Source += " (sequence " + s.IdentitySequence + " " + s.IdentityOptions + ")"
		d.sequence = s.IdentitySequence
		d.Fix = []string{c.alter("alter column %s add generated %s as identity (sequence name %s %s)", col, identityKinds[s.Identity], s.IdentitySequence, s.IdentityOptions)}
	default:
		d.Fix = []string{c.alter("alter column %s set generated %s", col, identityKinds[s.Identity])}
	}
	c.add(d)
}

// comment compares an object's comments; on is "comment on … <object>".
func (c *comparison) comment(object, src, tgt, on string) {
	if src == tgt {
		return
	}
	d := Difference{Kind: KindComment, Object: object, Source: src, Target: tgt, phase: phaseComment,
		Fix: []string{on + " is " + changebatch.QuoteLiteral(src)}}
	if src == "" {
		d.TargetOnly, d.Fix = true, []string{on + " is null"}
	}
	c.add(d)
}

func (c *comparison) constraints(src, tgt []Constraint) {
	// The target's key is named for the target table: the same key under another name is renamed.
	if s, found := primaryKey(src); found {
		if k, found := primaryKey(tgt); found && k.Def == s.Def && k.Name != s.Name {
			c.add(Difference{Kind: KindConstraint, Object: s.Name, Source: s.Def, Target: k.Name + " " + k.Def, phase: phaseConstraint,
				Fix: []string{c.alter("rename constraint %s to %s", q(k.Name), q(s.Name))}})
			tgt = slices.Clone(tgt)
			tgt[slices.IndexFunc(tgt, func(c Constraint) bool { return c.Kind == 'p' })].Name = s.Name
		}
	}
	pair(src, tgt, func(c Constraint) string { return c.Name }, func(s, t Constraint, found bool) {
		if found && t.Def == s.Def && (t.Validated || !s.Validated) {
			return
		}
		d := Difference{Kind: KindConstraint, Object: s.Name, Source: s.Def, Target: t.Def, phase: phaseConstraint}
		if s.Kind == 'f' {
			d.phase = phaseForeignKey
		}
		switch {
		case found && t.Def == s.Def:
			d.Target += " NOT VALID"
			d.fixSlowly(c.alter("validate constraint %s", q(s.Name)))
		case found:
			d.Fix = []string{c.alter("drop constraint %s", q(s.Name))}
			c.addConstraint(&d, s)
		default:
			c.addConstraint(&d, s)
		}
		c.add(d)
	}, func(t Constraint) {
		c.add(Difference{Kind: KindConstraint, Object: t.Name, Target: t.Def, TargetOnly: true, phase: phaseConstraint,
			Fix: []string{c.alter("drop constraint %s", q(t.Name))}})
	})
}

// addConstraint appends to d's Fix the statements that add constraint s: a check or foreign key
// NOT VALID first, then validated (which takes a lighter lock than checking while adding:
// PostgreSQL docs, ALTER TABLE, VALIDATE CONSTRAINT), unless the source's is not valid either.
func (c *comparison) addConstraint(d *Difference, s Constraint) {
	add := c.alter("add constraint %s %s", q(s.Name), s.Def)
	if s.Kind != 'c' && s.Kind != 'f' {
		d.Fix = append(d.Fix, add)
		return
	}
	d.Fix = append(d.Fix, add+" not valid")
	if s.Validated {
		d.fixSlowly(c.alter("validate constraint %s", q(s.Name)))
	}
}

func primaryKey(cons []Constraint) (Constraint, bool) {
	for _, k := range cons {
		if k.Kind == 'p' {
			return k, true
		}
	}
	return Constraint{}, false
}

func (c *comparison) indexes(src, tgt []Index) {
	drop := func(name string) string { return "drop index " + pgx.Identifier{c.t.Schema, name}.Sanitize() }
	pair(src, tgt, func(i Index) string { return i.Name }, func(s, t Index, found bool) {
		if found && t.Def == s.Def {
			return
		}
		d := Difference{Kind: KindIndex, Object: s.Name, Source: s.Def, Target: t.Def, phase: phaseIndex}
		if found {
			d.Fix = append(d.Fix, drop(s.Name))
		}
		d.fixSlowly(s.Def)
		c.add(d)
	}, func(t Index) {
		c.add(Difference{Kind: KindIndex, Object: t.Name, Target: t.Def, TargetOnly: true, phase: phaseIndex, Fix: []string{drop(t.Name)}})
	})
}

// triggerStates are the ALTER TABLE clauses that give a trigger each firing state.
var triggerStates = map[byte]string{'O': "enable trigger", 'D': "disable trigger", 'R': "enable replica trigger", 'A': "enable always trigger"}

func (c *comparison) triggers(src, tgt []Trigger) {
	pair(src, tgt, func(t Trigger) string { return t.Name }, func(s, t Trigger, found bool) {
		state := c.alter("%s %s", triggerStates[s.Enabled], q(s.Name))
		switch {
		case found && t.Def == s.Def && t.Enabled == s.Enabled:
		case found && t.Def == s.Def:
			c.add(Difference{Kind: KindTriggerState, Object: s.Name, Source: triggerStates[s.Enabled], Target: triggerStates[t.Enabled], phase: phaseTrigger,
				Fix: []string{state}})
		default:
			d := Difference{Kind: KindTrigger, Object: s.Name, Source: s.Def, Target: t.Def, phase: phaseTrigger}
			if found {
				d.Fix = append(d.Fix, "drop trigger "+q(s.Name)+" on "+c.t.Quoted())
			}
			d.Fix = append(d.Fix, s.Def)
			if s.Enabled != 'O' {
				d.Fix = append(d.Fix, state)
			}
			c.add(d)
		}
	}, func(t Trigger) {
		c.add(Difference{Kind: KindTrigger, Object: t.Name, Target: t.Def, TargetOnly: true, phase: phaseTrigger,
			Fix: []string{"drop trigger " + q(t.Name) + " on " + c.t.Quoted()}})
	})
}

// CompareTable reads table t on src and on tgt and compares them (Compare), as replicated when the
// target's has _cdc_ columns; it reports which. ownership is CompareOptions.Ownership. It also
// compares the sequences the source table uses with the target's of the same names (options and
// position: a target sequence behind the source's is a difference; pending while replicated, as
// the cutover syncs them). A table missing on either side is an error wrapping ErrNoTable.
func CompareTable(ctx context.Context, src, tgt Querier, t changebatch.TableName, ownership bool) (diffs []Difference, replicated bool, err error) {
	s, err := Read(ctx, src, t)
	if err != nil {
		return nil, false, fmt.Errorf("source: %w", err)
	}
	g, err := Read(ctx, tgt, t)
	if err != nil {
		return nil, false, fmt.Errorf("target: %w", err)
	}
	diffs = Compare(s, g, CompareOptions{Replicating: g.Replicated, Ownership: ownership})
	seqs, err := compareSequences(ctx, src, tgt, t, s.oid)
	if err != nil {
		return nil, false, err
	}
	for _, d := range seqs {
		if identitySequence(diffs, d.Object) {
			// The identity's fix makes it, with the source's options: only its position is left.
			d.Fix = slices.DeleteFunc(d.Fix, func(f string) bool { return !strings.HasPrefix(f, "select setval(") })
			if len(d.Fix) == 0 {
				continue
			}
		}
		d.Pending = g.Replicated
		diffs = append(diffs, d)
	}
	return diffs, g.Replicated, nil
}

// identitySequence reports whether an identity difference of diffs makes sequence name.
func identitySequence(diffs []Difference, name string) bool {
	return slices.ContainsFunc(diffs, func(d Difference) bool { return d.Kind == KindIdentity && d.sequence == name })
}
