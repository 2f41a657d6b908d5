// Package migrations holds the SQL of the target's pgconverge metadata schema, numbered files
// embedded in the binary and applied with tern (github.com/jackc/tern/v2/migrate).
//
// Invariant: the schema only moves forward; Apply is safe to call from several processes at once
// (an advisory lock of ours serialises the schema's creation, tern's the migrations) and is a
// no-op when the schema is current.
package migrations

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed *.sql
var files embed.FS

// Schema is the name of the target schema that holds pgconverge's metadata.
const Schema = "pgconverge"

// Apply brings the target's pgconverge schema to the newest version. It returns an error naming
// the migration that failed, or a privilege problem (the role needs CREATE on the database).
func Apply(ctx context.Context, conn *pgx.Conn) error { return ApplyTo(ctx, conn, 0) }

// ApplyTo brings the target's pgconverge schema to version (0: the newest), as Apply; tests build
// an older schema with it to check an upgrade.
func ApplyTo(ctx context.Context, conn *pgx.Conn, version int32) error {
	if err := createSchema(ctx, conn); err != nil {
		return err
	}
	m, err := migrate.NewMigrator(ctx, conn, Schema+".schema_version")
	if err != nil {
		return fmt.Errorf("prepare migrations: %w", err)
	}
	if err := m.LoadMigrations(files); err != nil {
		return fmt.Errorf("load embedded migrations: %w", err)
	}
	if version == 0 {
		version = int32(len(m.Migrations))
	}
	if err := m.MigrateTo(ctx, version); err != nil {
		return fmt.Errorf("migrate target schema %s: %w", Schema, err)
	}
	return nil
}

// schemaLockClass is the first key of the session advisory lock createSchema holds ('pgcm').
const schemaLockClass = 0x7067636d

// createSchema creates the metadata schema unless it exists. Two sessions' concurrent
// `create schema if not exists` can fail on the catalog's unique index (23505) instead of one of
// them seeing the other's schema, so processes that start at once on a new target take turns.
func createSchema(ctx context.Context, conn *pgx.Conn) (err error) {
	if _, err := conn.Exec(ctx, `select pg_advisory_lock($1, 0)`, schemaLockClass); err != nil {
		return fmt.Errorf("lock the creation of schema %s on the target: %w", Schema, err)
	}
	defer func() {
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), `select pg_advisory_unlock($1, 0)`, schemaLockClass); err == nil && uerr != nil {
			err = fmt.Errorf("unlock the creation of schema %s on the target: %w", Schema, uerr)
		}
	}()
	if _, err := conn.Exec(ctx, "create schema if not exists "+pgx.Identifier{Schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema %s on the target (the role needs CREATE on the database): %w", Schema, err)
	}
	return nil
}
