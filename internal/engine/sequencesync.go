package engine

import (
	"context"

	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/sequences"
)

// logSequenceSync syncs the sequences of the tables a daemon's backfill run completed and logs
// each outcome; a failure is logged at ERROR and does not stop the daemon (the data path does not
// depend on sequences), and the next completed backfill of the table tries again.
func logSequenceSync(ctx context.Context, cfg Config, tables []changebatch.Table, rep backfillrun.Report) {
	names := rep.Completed(tables)
	if !cfg.SyncSequences || len(names) == 0 {
		return
	}
	lines, err := sequences.SyncTables(ctx, cfg.Source, cfg.Target, names, cfg.Logger)
	for _, l := range lines {
		if l.Err == nil {
			cfg.Logger.Info("sequence synced", l.Attrs()...)
		}
	}
	if err != nil && ctx.Err() == nil {
		cfg.Logger.Error("sequence sync after backfill failed: the target's sequences may be behind the source's", "run", rep.RunID, "err", err)
	}
}
