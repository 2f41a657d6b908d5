package main

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
)

// ensureTypes creates on the target the user-defined enums, domains and composite types the tables
// use that it lacks, as the source defines them, and logs each one it created.
func ensureTypes(ctx context.Context, src, tgt *pgx.Conn, tables []changebatch.Table, log *slog.Logger) error {
	for _, t := range tables {
		defs, err := cdc.TypeDefinitions(ctx, src, t)
		if err != nil {
			return err
		}
		for _, d := range defs {
			created, labels, err := apply.EnsureType(ctx, tgt, d.Schema, d.Name, d.SQL, d.Labels)
			if err != nil {
				return err
			}
			if created {
				log.Info("created type on the target", "type", changebatch.QualifiedName(d.Schema, d.Name), "table", t.String())
			}
			if len(labels) > 0 {
				log.Info("added enum labels on the target", "type", changebatch.QualifiedName(d.Schema, d.Name), "labels", labels)
			}
		}
	}
	return nil
}

// ensureTables creates or reshapes the target tables for the tables as the source describes them
// now (apply.EnsureTable), with the types they need first, and logs each change of a table's
// columns. A change that leaves rows without the source's values is recorded at a source position
// read now, after the tables were described, so only a backfill read later counts.
func ensureTables(ctx context.Context, src, tgt *pgx.Conn, tables []changebatch.Table, log *slog.Logger) error {
	if err := ensureTypes(ctx, src, tgt, tables, log); err != nil {
		return err
	}
	changedAt, err := cdc.CurrentLSN(ctx, src)
	if err != nil {
		return err
	}
	for _, t := range tables {
		r, err := apply.EnsureTable(ctx, tgt, t, changedAt)
		if err != nil {
			return err
		}
		if r.Reloads() {
			log.Warn("source table's columns changed: changed the target table to match; its existing rows are loaded again from a new snapshot",
				"table", t.String(), "added", r.Added, "changed_type", r.Retyped, "schema_changed_lsn", changedAt.String())
		}
		if len(r.Generated)+len(r.Plain) > 0 {
			log.Info("changed the target table's generated columns to the source's", "table", t.String(),
				"added_generated", r.Generated, "made_plain", r.Plain)
		}
		if len(r.Kept) > 0 {
			log.Info("target table keeps columns the source table no longer has (dropped or renamed there); nothing writes them any more",
				"table", t.String(), "columns", r.Kept)
		}
	}
	return nil
}
