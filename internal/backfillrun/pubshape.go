package backfillrun

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
)

// ReadLedgerPublicationShape fits t to what the publication that the slot following t streams
// from publishes of it (cdc.ReadPublicationShape: row filter, column list), for the reads of a
// process that is not the daemon (a manual backfill, verify): the publication is the one the
// target's ledger records (coverage.LedgerPublication); t is left whole when no stream ever
// followed it. A backfill or a verify must read exactly what the stream sees.
func ReadLedgerPublicationShape(ctx context.Context, src, tgt *pgx.Conn, t *changebatch.Table) error {
	pub, err := coverage.LedgerPublication(ctx, tgt, t.TableName)
	if err != nil || pub == "" {
		return err
	}
	return cdc.ReadPublicationShape(ctx, src, pub, t)
}
