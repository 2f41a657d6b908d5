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
			created, err := apply.EnsureType(ctx, tgt, d.Schema, d.Name, d.SQL)
			if err != nil {
				return err
			}
			if created {
				log.Info("created type on the target", "type", changebatch.QualifiedName(d.Schema, d.Name), "table", t.String())
			}
		}
	}
	return nil
}
