// Package migrations holds the SQL of the target's pgconverge metadata schema, numbered files
// embedded in the binary and applied with tern (github.com/jackc/tern/v2/migrate).
//
// Invariant: the schema only moves forward; Apply is safe to call from several processes at once
// (LockDDL serialises the schema's creation, tern's advisory lock the migrations) and is a no-op
// when the schema is current.
package migrations

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
	"github.com/pgconverge/pgconverge/internal/advisory"
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

// LockDDL takes, for conn's session, the lock under which pgconverge processes create objects on
// the target one at a time (advisory.DDL), waiting for it: the metadata schema (Apply), and target tables, their
// schemas and types (the engine's table setup); unlock releases it. PostgreSQL's
// `CREATE … IF NOT EXISTS` and look-up-then-create both fail with 23505 on a catalog's unique index
// when two sessions create one name at once (two daemons, or a daemon and a backfill, starting
// together on a new target). The lock is the target database's, so while one process waits for a
// table lock in a reshape, the others' table setup waits too.
func LockDDL(ctx context.Context, conn *pgx.Conn) (unlock func(), err error) {
	if _, err := conn.Exec(ctx, `select `+advisory.DDL().Lock()); err != nil {
		return nil, fmt.Errorf("take the lock for creating objects on the target: %w", err)
	}
	return func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `select `+advisory.DDL().Unlock())
	}, nil
}

// createSchema creates the metadata schema unless it exists, under LockDDL.
func createSchema(ctx context.Context, conn *pgx.Conn) error {
	unlock, err := LockDDL(ctx, conn)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := conn.Exec(ctx, "create schema if not exists "+pgx.Identifier{Schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema %s on the target (the role needs CREATE on the database): %w", Schema, err)
	}
	return nil
}
