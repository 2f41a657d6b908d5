package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
)

// readLedgerRowFilter sets t.RowFilter for the reads of a process that is not the daemon (a
// manual backfill, verify): the row filter of the publication that the slot following t streams
// from, as the target's ledger records them (pgconverge.tables.slot, the slot's latest stream
// segment); none when no slot follows t. A backfill or a verify must read exactly the rows the
// stream sees.
func readLedgerRowFilter(ctx context.Context, src, tgt *pgx.Conn, t *changebatch.Table) error {
	var pub *string
	err := tgt.QueryRow(ctx, `select (select s.publication from pgconverge.stream_segments s where s.slot = t.slot order by s.id desc limit 1)
from pgconverge.tables t where t.schema_name = $1 and t.table_name = $2`, t.Schema, t.Name).Scan(&pub)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && pub == nil) {
		t.RowFilter = ""
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the publication that follows %s: %w", t, err)
	}
	return cdc.ReadRowFilter(ctx, src, *pub, t)
}
