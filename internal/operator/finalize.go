package operator

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/tableschema"
)

// finalize is cutover's --finalize: each target table is made plain (apply.Finalize) and given
// the source's schema objects (tableschema.Carry), both in one target transaction per table; then
// the foreign keys, each table's in one transaction, once every table has the unique constraints
// they may reference; then, with CarryOwnership, each table's owner and grants; then each table
// is analyzed. Last it compares every table's schema with the
// source's (as verify --schema does) and fails, naming each difference and its fix, unless only
// objects of the target's own are left, which it reports. Each step is idempotent: run again, it
// does what is left.
func finalize(ctx context.Context, cfg CutoverConfig, src, tgt *pgx.Conn, tables []changebatch.TableName, rep *CutoverReport) error {
	log := cfg.Run.Logger
	sources, err := readSchemas(ctx, src, tables)
	if err != nil {
		return fmt.Errorf("finalize: %w", err)
	}
	for _, pass := range tableschema.Passes() {
		for i, t := range tables {
			err := pgx.BeginFunc(ctx, tgt, func(tx pgx.Tx) error {
				changed, carried, err := finalizeTable(ctx, tx, sources[i], tableschema.CarryOptions{Pass: pass}, cfg.CarryOwnership)
				if err != nil {
					return err
				}
				if changed {
					rep.Finalized = append(rep.Finalized, t.String())
					log.Info("cutover: target table made plain (tombstones and _cdc_ columns gone)", "table", t.String())
				}
				for _, d := range carried {
					rep.Carried = append(rep.Carried, fmt.Sprintf("%s: %s %s", t, d.Kind, d.Object))
					log.Info("cutover: carried over from the source", "table", t.String(), "kind", d.Kind, "object", d.Object)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if pass == tableschema.PassObjects {
				cfg.step("finalized-table")
			}
		}
	}
	for _, t := range tables {
		if _, err := tgt.Exec(ctx, "analyze "+t.Quoted()); err != nil {
			return fmt.Errorf("finalize: analyze %s: %w", t, err)
		}
	}
	if err := checkSchemas(ctx, src, tgt, tables, cfg.CarryOwnership, rep); err != nil {
		return err
	}
	if err := coverage.MarkCutoverStep(ctx, tgt, cfg.Run.Slot, "finalized"); err != nil {
		return err
	}
	cfg.step("finalized")
	return nil
}

// checkSchemas compares each finalized table's schema with the source's: the objects only the
// target has are reported (rep.TargetOnly), any other difference is an error naming it and its
// fix.
func checkSchemas(ctx context.Context, src, tgt *pgx.Conn, tables []changebatch.TableName, ownership bool, rep *CutoverReport) error {
	var left []string
	for _, t := range tables {
		diffs, _, err := tableschema.CompareTable(ctx, src, tgt, t, ownership)
		if err != nil {
			return fmt.Errorf("finalize: compare schemas: %w", err)
		}
		for _, d := range diffs {
			if d.TargetOnly {
				rep.TargetOnly = append(rep.TargetOnly, fmt.Sprintf("%s: %s %s", t, d.Kind, d.Object))
				continue
			}
			left = append(left, fmt.Sprintf("%s: %s %s differs (source %q, target %q); fix: %s", t, d.Kind, d.Object, d.Source, d.Target, strings.Join(d.Fix, "; ")))
		}
	}
	if len(left) > 0 {
		return errors.New("finalize: the target's schema still differs from the source's after finalizing (pgconverge verify --schema lists it):\n  " + strings.Join(left, "\n  "))
	}
	return nil
}

// errRehearsed rolls back rehearseFinalize's transaction.
var errRehearsed = errors.New("rehearsed")

// rehearseFinalize runs what finalize would do to the tables, but index builds and validations
// (tableschema.CarryOptions.Rehearse), in one target transaction that it rolls back: a
// switchover (--pause-writes) learns that finalizing will work before it records the cutover,
// so that a failure cuts over nothing. The tables' locks are held meanwhile: the stream must be
// stopped.
func rehearseFinalize(ctx context.Context, src, tgt *pgx.Conn, tables []changebatch.TableName, ownership bool) error {
	sources, err := readSchemas(ctx, src, tables)
	if err != nil {
		return fmt.Errorf("rehearse finalize: %w", err)
	}
	err = pgx.BeginFunc(ctx, tgt, func(tx pgx.Tx) error {
		for _, pass := range tableschema.Passes() {
			for _, s := range sources {
				if _, _, err := finalizeTable(ctx, tx, s, tableschema.CarryOptions{Pass: pass, Rehearse: true}, ownership); err != nil {
					return err
				}
			}
		}
		return errRehearsed
	})
	if errors.Is(err, errRehearsed) {
		return nil
	}
	return fmt.Errorf("rehearse finalize (nothing was cut over): %w", err)
}

// readSchemas reads the tables' schemas on src.
func readSchemas(ctx context.Context, src *pgx.Conn, tables []changebatch.TableName) ([]tableschema.Schema, error) {
	out := make([]tableschema.Schema, len(tables))
	for i, t := range tables {
		s, err := tableschema.Read(ctx, src, t)
		if err != nil {
			return nil, fmt.Errorf("source: %w", err)
		}
		out[i] = s
	}
	return out, nil
}

// finalizeTable makes the target table of source plain (apply.Finalize, in the objects' pass),
// partitioned as source is (tableschema.Repartition), and carries source's objects over as opts say (the owner and grants too with ownership), in
// tx. It reports whether it made the table plain, and what it carried.
func finalizeTable(ctx context.Context, tx pgx.Tx, source tableschema.Schema, opts tableschema.CarryOptions, ownership bool) (bool, []tableschema.Difference, error) {
	changed := false
	if opts.Pass == tableschema.PassObjects {
		var err error
		if changed, err = apply.Finalize(ctx, tx, source.Table); err != nil {
			return false, nil, err
		}
	}
	compare := func() ([]tableschema.Difference, error) {
		target, err := tableschema.Read(ctx, tx, source.Table)
		if err != nil {
			return nil, fmt.Errorf("target: %w", err)
		}
		return tableschema.Compare(source, target, tableschema.CompareOptions{Ownership: ownership}), nil
	}
	diffs, err := compare()
	if err != nil {
		return false, nil, err
	}
	if opts.Pass == tableschema.PassObjects {
		repartitioned, err := tableschema.Repartition(ctx, tx, diffs, opts.Rehearse)
		if err != nil {
			return false, nil, err
		}
		if repartitioned {
			if diffs, err = compare(); err != nil {
				return false, nil, err
			}
		}
	}
	carried, err := tableschema.Carry(ctx, tx, diffs, opts)
	return changed, carried, err
}
