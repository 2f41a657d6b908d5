package apply

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

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
