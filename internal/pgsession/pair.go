package pgsession

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrSameDatabase is CheckDistinct's refusal: the source and target URLs reach one database.
var ErrSameDatabase = errors.New("source and target URLs reach the same database: replicate into another database")

// ValidateURLs returns the problems of a source and target URL pair, one error each, naming the
// flag or variable to fix: a missing URL, or the same URL twice. None is nil.
func ValidateURLs(source, target string) []error {
	var errs []error
	if source == "" {
		errs = append(errs, errors.New("no source: pass --source URL or set PGCONVERGE_SOURCE"))
	}
	if target == "" {
		errs = append(errs, errors.New("no target: pass --target URL or set PGCONVERGE_TARGET"))
	}
	if source != "" && source == target {
		errs = append(errs, errors.New("source and target are the same URL: they must be two different databases"))
	}
	return errs
}

// ConnectBoth connects to the source and the target URLs (Connect, roles "source" and "target");
// close both with CloseBoth. When the target fails, the source connection is closed again.
func ConnectBoth(ctx context.Context, source, target string) (src, tgt *pgx.Conn, err error) {
	if src, err = Connect(ctx, source, "source"); err != nil {
		return nil, nil, err
	}
	if tgt, err = Connect(ctx, target, "target"); err != nil {
		src.Close(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return src, tgt, nil
}

// CloseBoth closes the connections ConnectBoth opened.
func CloseBoth(ctx context.Context, src, tgt *pgx.Conn) {
	src.Close(ctx)
	tgt.Close(ctx)
}

// CheckDistinct refuses, with ErrSameDatabase, a target that is the source database under another
// URL (another host name for the same server, say): the server's start time and the database's
// oid identify it. Other errors are failures of the identifying query.
func CheckDistinct(ctx context.Context, src, tgt *pgx.Conn) error {
	const q = `select pg_postmaster_start_time()::text || '/' || (select oid from pg_database where datname = current_database())::text`
	var a, b string
	if err := src.QueryRow(ctx, q).Scan(&a); err != nil {
		return fmt.Errorf("identify source database: %w", err)
	}
	if err := tgt.QueryRow(ctx, q).Scan(&b); err != nil {
		return fmt.Errorf("identify target database: %w", err)
	}
	if a == b {
		return ErrSameDatabase
	}
	return nil
}
