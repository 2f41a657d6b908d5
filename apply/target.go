package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// EnsureTable creates the target table for t when it is missing (see createTableSQL) and registers
// it in pgconverge.tables. When the table exists it checks that it has every source column and the
// metadata columns, and returns an error naming what is missing otherwise.
func EnsureTable(ctx context.Context, conn *pgx.Conn, t changebatch.Table) error {
	if _, err := conn.Exec(ctx, "create schema if not exists "+pgx.Identifier{t.Schema}.Sanitize()); err != nil {
		return fmt.Errorf("create target schema %q: %w", t.Schema, err)
	}
	if _, err := conn.Exec(ctx, createTableSQL(t)); err != nil {
		return fmt.Errorf("create target table %s: %w", t, err)
	}
	rows, err := conn.Query(ctx, `select attname from pg_attribute
where attrelid = $1::regclass and attnum > 0 and not attisdropped`, t.Quoted())
	if err != nil {
		return fmt.Errorf("read columns of target table %s: %w", t, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read columns of target table %s: %w", t, err)
	}
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	var missing []string
	for _, c := range t.Columns {
		if !have[c.Name] {
			missing = append(missing, c.Name)
		}
	}
	for _, c := range []string{changebatch.ColLSN, changebatch.ColSeq, changebatch.ColDeleted, changebatch.ColUnknown} {
		if !have[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("target table %s exists but lacks columns %s: drop it so pgconverge recreates it, or add them",
			t, strings.Join(missing, ", "))
	}
	_, err = conn.Exec(ctx, `insert into pgconverge.tables (schema_name, table_name) values ($1, $2)
on conflict do nothing`, t.Schema, t.Name)
	if err != nil {
		return fmt.Errorf("register table %s: %w", t, err)
	}
	return nil
}

// ReadProgress returns the position up to which the target holds every change for slot, and
// false when nothing was recorded yet.
func ReadProgress(ctx context.Context, conn *pgx.Conn, slot string) (pglogrepl.LSN, bool, error) {
	var s string
	err := conn.QueryRow(ctx, `select applied_lsn::text from pgconverge.progress where slot = $1`, slot).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read progress of slot %q: %w", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	return lsn, true, err
}

// StartSlot records a new incarnation of slot created at its consistent point: the progress moves
// to that point (history before it comes from the initial load) in one transaction with the
// caller's other writes.
func StartSlot(ctx context.Context, tx pgx.Tx, slot string, consistentPoint pglogrepl.LSN) error {
	_, err := tx.Exec(ctx, `insert into pgconverge.progress (slot, applied_lsn, slot_created_lsn) values ($1, $2::pg_lsn, $2::pg_lsn)
on conflict (slot) do update set applied_lsn = excluded.applied_lsn, slot_created_lsn = excluded.slot_created_lsn, updated_at = now()`,
		slot, consistentPoint.String())
	if err != nil {
		return fmt.Errorf("record new slot %q at %s: %w", slot, consistentPoint, err)
	}
	return nil
}

// LoadedTables returns, for every registered table with a completed load or backfill, the
// snapshot LSN S of the last one, keyed by changebatch.QualifiedName.
func LoadedTables(ctx context.Context, conn *pgx.Conn) (map[string]pglogrepl.LSN, error) {
	rows, err := conn.Query(ctx, `select schema_name, table_name, loaded_lsn::text from pgconverge.tables where loaded_lsn is not null`)
	if err != nil {
		return nil, fmt.Errorf("read loaded tables: %w", err)
	}
	defer rows.Close()
	out := map[string]pglogrepl.LSN{}
	for rows.Next() {
		var s, n, l string
		if err := rows.Scan(&s, &n, &l); err != nil {
			return nil, fmt.Errorf("read loaded tables: %w", err)
		}
		lsn, err := pglogrepl.ParseLSN(l)
		if err != nil {
			return nil, fmt.Errorf("read loaded tables: %w", err)
		}
		out[changebatch.QualifiedName(s, n)] = lsn
	}
	return out, rows.Err()
}

// StartBackfill records a running backfill of table t from snapshot LSN s and returns its id.
func StartBackfill(ctx context.Context, conn *pgx.Conn, t changebatch.Table, s pglogrepl.LSN) (int64, error) {
	var id int64
	err := conn.QueryRow(ctx, `insert into pgconverge.backfills (schema_name, table_name, snapshot_lsn, status)
values ($1, $2, $3::pg_lsn, 'running') returning id`, t.Schema, t.Name, s.String()).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record backfill of %s at %s: %w", t, s, err)
	}
	return id, nil
}

// FinishBackfill marks backfill id completed with its row count and the table loaded at its
// snapshot LSN, in tx so it commits with the backfill's last rows.
func FinishBackfill(ctx context.Context, tx pgx.Tx, id int64, rows int64) error {
	_, err := tx.Exec(ctx, `with b as (
  update pgconverge.backfills set status = 'completed', rows = $2, finished_at = now() where id = $1
  returning schema_name, table_name, snapshot_lsn)
update pgconverge.tables t set loaded_lsn = b.snapshot_lsn, loaded_at = now()
from b where t.schema_name = b.schema_name and t.table_name = b.table_name`, id, rows)
	if err != nil {
		return fmt.Errorf("complete backfill %d: %w", id, err)
	}
	return nil
}

// AbandonBackfills marks every backfill still recorded as running for table t as failed: a process
// that died mid-run leaves such rows behind.
func AbandonBackfills(ctx context.Context, conn *pgx.Conn, t changebatch.Table) error {
	_, err := conn.Exec(ctx, `update pgconverge.backfills set status = 'failed', finished_at = now()
where schema_name = $1 and table_name = $2 and status = 'running'`, t.Schema, t.Name)
	if err != nil {
		return fmt.Errorf("close abandoned backfills of %s: %w", t, err)
	}
	return nil
}
