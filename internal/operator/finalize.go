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
// they may reference; then each table is analyzed. Last it compares every table's schema with the
// source's (as verify --schema does) and fails, naming each difference and its fix, unless only
// objects of the target's own are left, which it reports. Each step is idempotent: run again, it
// does what is left.
func finalize(ctx context.Context, cfg CutoverConfig, src, tgt *pgx.Conn, tables []changebatch.TableName, rep *CutoverReport) error {
	log := cfg.Run.Logger
	sources := make([]tableschema.Schema, len(tables))
	for i, t := range tables {
		s, err := tableschema.Read(ctx, src, t)
		if err != nil {
			return fmt.Errorf("finalize: source: %w", err)
		}
		sources[i] = s
	}
	for _, foreignKeys := range []bool{false, true} {
		for i, t := range tables {
			err := pgx.BeginFunc(ctx, tgt, func(tx pgx.Tx) error {
				changed := false
				if !foreignKeys {
					var err error
					if changed, err = apply.Finalize(ctx, tx, t); err != nil {
						return err
					}
				}
				target, err := tableschema.Read(ctx, tx, t)
				if err != nil {
					return fmt.Errorf("finalize: target: %w", err)
				}
				carried, err := tableschema.Carry(ctx, tx, tableschema.Compare(sources[i], target, false), foreignKeys)
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
			if !foreignKeys {
				cfg.step("finalized-table")
			}
		}
	}
	for _, t := range tables {
		if _, err := tgt.Exec(ctx, "analyze "+t.Quoted()); err != nil {
			return fmt.Errorf("finalize: analyze %s: %w", t, err)
		}
	}
	if err := checkSchemas(ctx, src, tgt, tables, rep); err != nil {
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
func checkSchemas(ctx context.Context, src, tgt *pgx.Conn, tables []changebatch.TableName, rep *CutoverReport) error {
	var left []string
	for _, t := range tables {
		diffs, _, err := tableschema.CompareTable(ctx, src, tgt, t)
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
