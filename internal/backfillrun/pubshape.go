package backfillrun

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
)

// ReadLedgerPublicationShape fits t to what the publication that the slot following t streams
// from publishes of it (cdc.ReadPublicationShape: row filter, column list), for the reads of a
// process that is not the daemon (a manual backfill, verify): the publication is the one the
// target's ledger records (pgconverge.tables.slot, the slot's latest stream segment, else the
// segment of the table's latest stream span); t is left whole when no stream ever followed it. A backfill or a verify must read exactly what the stream sees.
func ReadLedgerPublicationShape(ctx context.Context, src, tgt *pgx.Conn, t *changebatch.Table) error {
	var pub *string
	// A table marked not loaded (its slot cleared, say after a membership change under
	// --on-gap=alert) still has the publication its last stream span was in.
	err := tgt.QueryRow(ctx, `select coalesce(
  (select s.publication from pgconverge.stream_segments s where s.slot = t.slot order by s.id desc limit 1),
  (select s.publication from pgconverge.table_spans sp join pgconverge.stream_segments s on s.id = sp.segment_id
    where sp.schema_name = t.schema_name and sp.table_name = t.table_name order by sp.id desc limit 1))
from pgconverge.tables t where t.schema_name = $1 and t.table_name = $2`, t.Schema, t.Name).Scan(&pub)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && pub == nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the publication that follows %s: %w", t, err)
	}
	return cdc.ReadPublicationShape(ctx, src, *pub, t)
}
