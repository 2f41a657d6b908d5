package backfillrun

import (
	"context"
	"log/slog"

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

// EnsureTables creates or reshapes the target tables for the tables as the source describes them
// now (apply.EnsureTable), with the types they need first, and logs each change of a table's
// columns. A change that leaves rows without the source's values is recorded at a source position
// read now, after the tables were described, so only a backfill read later counts. It returns
// the enums the tables use, as ensureTypes. Processes do this one at a time (migrations.LockDDL).
// The reshapes, which may rewrite a table, have no statement deadline (pgsession.Unbound).
func EnsureTables(ctx context.Context, src, tgt *pgx.Conn, tables []changebatch.Table, log *slog.Logger) (map[string][]string, error) {
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
