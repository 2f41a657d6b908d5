package coverage

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// ErrStillFollowed is wrapped by Retire's error for a table a stream still follows.
var ErrStillFollowed = errors.New("a stream still follows the table")

// Retire records that no stream is to follow tables any more (pgconverge.tables.retired_at): the
// coverage report then calls them Retired instead of NotStreamed, so a check passes. In one
// transaction, all or nothing; a table retired already keeps its time. It returns an error
// naming every table the ledger does not register, and one wrapping ErrStillFollowed for every
// table with an open stream span (a daemon that is stopped follows it too, until it starts
// without it). It returns the tables it retired now.
func Retire(ctx context.Context, conn *pgx.Conn, tables []changebatch.TableName) ([]changebatch.TableName, error) {
	var retired []changebatch.TableName
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var errs []error
		for _, t := range tables {
			var known, followed, already bool
			err := tx.QueryRow(ctx, `select exists (select 1 from pgconverge.tables where schema_name = $1 and table_name = $2),
  exists (select 1 from pgconverge.table_spans s join pgconverge.tables g using (schema_name, table_name)
    where s.schema_name = $1 and s.table_name = $2 and s.generation = g.generation and s.end_lsn is null),
  exists (select 1 from pgconverge.tables where schema_name = $1 and table_name = $2 and retired_at is not null)`,
				t.Schema, t.Name).Scan(&known, &followed, &already)
			if err != nil {
				return fmt.Errorf("read the ledger of %s: %w", t, err)
			}
			switch {
			case !known:
				errs = append(errs, fmt.Errorf("table %s is not in the target's ledger (pgconverge.tables): nothing to retire", t))
			case followed:
				errs = append(errs, fmt.Errorf("%w: %s: start pgconverge run without it in --tables (or stop following it with ALTER PUBLICATION … DROP TABLE and let the daemon notice), then retire it", ErrStillFollowed, t))
			case !already:
				if _, err := tx.Exec(ctx, `update pgconverge.tables set retired_at = now(), retired_reason = 'pgconverge retire' where schema_name = $1 and table_name = $2`, t.Schema, t.Name); err != nil {
					return fmt.Errorf("retire %s: %w", t, err)
				}
				retired = append(retired, t)
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		return nil, err
	}
	return retired, nil
}

// RetireLeft retires the tables of reasons, which a session stops following for the reason given
// (the source table was dropped, or became a partition of a table the session follows): nothing
// is left to follow under that name. It does not check spans: the session that calls it ends them.
func RetireLeft(ctx context.Context, conn *pgx.Conn, reasons map[changebatch.TableName]string) error {
	for t, why := range reasons {
		_, err := conn.Exec(ctx, `update pgconverge.tables set retired_at = now(), retired_reason = $3
where schema_name = $1 and table_name = $2 and retired_at is null`, t.Schema, t.Name, why)
		if err != nil {
			return fmt.Errorf("retire %s: %w", t, err)
		}
	}
	return nil
}

// Unretire clears the retirement of those of tables that were retired (a run selected them
// again) and returns them: each is loaded again, as a table that left the selection is.
func Unretire(ctx context.Context, conn *pgx.Conn, tables []changebatch.Table) ([]changebatch.TableName, error) {
	schemas, names := make([]string, len(tables)), make([]string, len(tables))
	for i, t := range tables {
		schemas[i], names[i] = t.Schema, t.Name
	}
	rows, err := conn.Query(ctx, `update pgconverge.tables set retired_at = null, retired_reason = null
where retired_at is not null and (schema_name, table_name) in (select * from unnest($1::text[], $2::text[]))
returning schema_name, table_name`, schemas, names)
	if err != nil {
		return nil, fmt.Errorf("clear the retirement of selected tables: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[changebatch.TableName])
	if err != nil {
		return nil, fmt.Errorf("clear the retirement of selected tables: %w", err)
	}
	return out, nil
}
