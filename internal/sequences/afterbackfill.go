package sequences

import (
	"context"
	"log/slog"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// SyncAfterBackfill syncs the sequences of tables, those a daemon's backfill run completed (run
// is its id in pgconverge.backfill_runs), over new connections to the source (or, when it is a
// standby, primaryURL) and target URLs (SyncTables), and logs each synced sequence at INFO. No table: it does nothing. It returns
// nothing: a failure is logged at ERROR (unless ctx ended) and does not stop the daemon (the data
// path does not depend on sequences); the next completed backfill of the table tries again.
func SyncAfterBackfill(ctx context.Context, sourceURL, primaryURL, targetURL string, tables []changebatch.TableName, run int64, log *slog.Logger) {
	if len(tables) == 0 {
		return
	}
	lines, err := SyncTables(ctx, sourceURL, primaryURL, targetURL, tables, log)
	for _, l := range lines {
		if l.Err == nil {
			log.Info("sequence synced", l.Attrs()...)
		}
	}
	if err != nil && ctx.Err() == nil {
		log.Error("sequence sync after backfill failed: the target's sequences may be behind the source's", "run", run, "err", err)
	}
}
