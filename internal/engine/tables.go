package engine

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/migrations"
)

// ensureTypes creates on the target the user-defined types the tables use that it lacks, as the
// source defines them, brings existing enums' labels in line, and logs each change. It returns
// the source's enums the tables use, by quoted name, with their labels in sort order.
func ensureTypes(ctx context.Context, src, tgt *pgx.Conn, tables []changebatch.Table, log *slog.Logger) (map[string][]string, error) {
	enums := map[string][]string{}
	for _, t := range tables {
		defs, err := cdc.TypeDefinitions(ctx, src, t)
		if err != nil {
			return nil, err
		}
		for _, d := range defs {
			if d.Labels != nil {
				enums[pgx.Identifier{d.Schema, d.Name}.Sanitize()] = d.Labels
			}
			var labels []apply.EnumLabel
			for i, l := range d.Labels {
				labels = append(labels, apply.EnumLabel{OID: d.LabelOIDs[i], Label: l})
			}
			created, changed, err := apply.EnsureType(ctx, tgt, d.Schema, d.Name, d.SQL, labels)
			if err != nil {
				return nil, err
			}
			if created {
				log.Info("created type on the target", "type", changebatch.QualifiedName(d.Schema, d.Name), "table", t.String())
			}
			if len(changed) > 0 {
				log.Info("changed enum labels on the target as on the source", "type", changebatch.QualifiedName(d.Schema, d.Name), "labels", changed)
			}
		}
	}
	return enums, nil
}

// ensureTables creates or reshapes the target tables for the tables as the source describes them
// now (apply.EnsureTable), with the types they need first, and logs each change of a table's
// columns. A change that leaves rows without the source's values is recorded at a source position
// read now, after the tables were described, so only a backfill read later counts. It returns
// the enums the tables use, as ensureTypes. Processes do this one at a time (migrations.LockDDL).
// The reshapes, which may rewrite a table, have no statement deadline (pgsession.Unbound).
func ensureTables(ctx context.Context, src, tgt *pgx.Conn, tables []changebatch.Table, log *slog.Logger) (map[string][]string, error) {
	unlock, err := migrations.LockDDL(ctx, tgt)
	if err != nil {
		return nil, err
	}
	defer unlock()
	enums, err := ensureTypes(ctx, src, tgt, tables, log)
	if err != nil {
		return nil, err
	}
	changedAt, err := cdc.CurrentLSN(ctx, src)
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		r, err := apply.EnsureTable(pgsession.Unbound(ctx), tgt, t, changedAt, coverage.AbandonBackfills)
		if err != nil {
			return nil, err
		}
		if r.Reloads() {
			log.Warn("source table changed in a way no streamed change shows (its columns, or a rewrite such as TRUNCATE, VACUUM FULL or ALTER COLUMN TYPE): target table brought in line; its rows are loaded again from a new snapshot",
				"table", t.String(), "added", r.Added, "replaced", r.Replaced, "changed_type", r.Retyped, "rewritten", r.Rewritten, "key", r.Rekeyed, "schema_changed_lsn", changedAt.String())
		}
		if len(r.Generated)+len(r.Plain) > 0 {
			log.Info("changed the target table's generated columns to the source's", "table", t.String(),
				"generated", r.Generated, "made_plain", r.Plain)
		}
		if len(r.Kept) > 0 {
			log.Info("target table keeps columns the source table no longer has (dropped or renamed there); nothing writes them any more",
				"table", t.String(), "columns", r.Kept)
		}
	}
	return enums, nil
}

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
		if isCode(err, pgerrcode.DependentObjectsStillExist) {
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
