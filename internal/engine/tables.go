package engine

import (
	"context"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// ensureLiveViews creates or replaces the live view of each table (apply.EnsureLiveView) when
// Config.LiveSuffix is set. A view it cannot change (other objects depend on it) is logged at
// ERROR with the fix and left as it was: the views are a convenience, the tables stay followed.
// Other errors are returned.
func (s *session) ensureLiveViews(ctx context.Context, tables []changebatch.Table) error {
	if s.cfg.LiveSuffix == "" {
		return nil
	}
	for _, t := range tables {
		err := apply.EnsureLiveView(ctx, s.tgt, t, s.cfg.LiveSuffix)
		if pgsession.IsCode(err, pgerrcode.DependentObjectsStillExist) {
			s.cfg.Logger.Error("live view not changed", "table", t.String(), "view", apply.LiveViewName(t.TableName, s.cfg.LiveSuffix).String(), "err", err)
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// retireLeft retires (coverage.RetireLeft) those of the tables the session no longer follows
// (forgotten, as coverage.ForgetTables names them) that have nothing left to follow under their
// name: the source table was attached as a partition of a table the session follows, whose
// stream carries its rows now (and which is loaded again for it). Each is logged at INFO; it
// returns the others. A dropped source table is logged at ERROR and returned.
func (s *session) retireLeft(ctx context.Context, forgotten []string) ([]string, error) {
	followed := map[string]bool{}
	for _, t := range s.tables {
		followed[t.String()] = true
	}
	reasons := map[changebatch.TableName]string{}
	var rest []string
	for _, name := range forgotten {
		n, err := changebatch.ParseTableName(name)
		if err != nil {
			return nil, err
		}
		var dropped bool
		var ancestors []string
		err = s.src.QueryRow(ctx, `select c.oid is null, coalesce((select array_agg(format('%I.%I', n.nspname, r.relname)) from pg_partition_ancestors(c.oid) a
    join pg_class r on r.oid = a.relid join pg_namespace n on n.oid = r.relnamespace where a.relid <> c.oid), '{}')
from (select to_regclass($1) as oid) c`, n.Quoted()).Scan(&dropped, &ancestors)
		if err != nil {
			return nil, fmt.Errorf("look up source table %s: %w", n, err)
		}
		// A table dropped on the source is not retired here: its last changes before the DROP
		// may still wait in the slot, which no stream of this session delivers (the table has no
		// description any more), so its copy may lack them; the operator retires it.
		why := ""
		if dropped {
			s.cfg.Logger.Error("source table dropped: its target copy is not followed any more and may lack the changes made after its watermark and before the DROP; once that is fine, retire it: pgconverge retire --table "+n.String(),
				"table", n.String())
			rest = append(rest, name)
			continue
		}
		for _, a := range ancestors {
			if an, err := changebatch.ParseTableName(a); err == nil && followed[an.String()] {
				why = "attached as a partition of " + an.String() + ", which is followed"
			}
		}
		if why == "" {
			rest = append(rest, name)
			continue
		}
		reasons[n] = why
		s.cfg.Logger.Info("table no longer followed under its own name: retired", "table", name, "why", why)
	}
	return rest, coverage.RetireLeft(ctx, s.tgt, reasons)
}
