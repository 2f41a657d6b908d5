package backfillrun

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
)

// holdEpoch holds epoch of slot on conn (apply.HoldEpoch) for a daemon's backfill run, and
// nothing for a run of no daemon (epoch 0). Call release when done.
func holdEpoch(ctx context.Context, conn *pgx.Conn, slot string, epoch int64) (release func(), err error) {
	if epoch == 0 {
		return func() {}, nil
	}
	return apply.HoldEpoch(ctx, conn, slot, epoch)
}
