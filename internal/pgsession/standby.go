package pgsession

import (
	"context"
	"time"
)

// StandbySnapshotEvery is how often LogStandbySnapshots asks the primary for a running-transactions
// record while a slot is created on its standby.
const StandbySnapshotEvery = 500 * time.Millisecond

// LogStandbySnapshots calls pg_log_standby_snapshot() on the primary at primaryURL every
// StandbySnapshotEvery until the returned stop is called (or ctx ends), on a connection of its own,
// and reconnects after a failure. A logical slot created on a standby (PostgreSQL 16 and later)
// waits until the standby replays running-transactions records (xl_running_xacts) showing every
// transaction that ran at its start ended, and the primary logs one on its own only every 15 s,
// and never while it writes nothing (PostgreSQL docs §47.2.3 "logical decoding on standby", §9.27.6
// pg_log_standby_snapshot). Failures are left to the caller's own wait: a slot's creation still
// ends when the primary logs a record itself. With primaryURL "" it does nothing.
func LogStandbySnapshots(ctx context.Context, primaryURL string) (stop func()) {
	if primaryURL == "" {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(StandbySnapshotEvery)
		defer tick.Stop()
		for {
			conn, err := Connect(ctx, primaryURL, "primary")
			for err == nil {
				_, err = conn.Exec(ctx, `select pg_log_standby_snapshot()`)
				if err == nil {
					select {
					case <-ctx.Done():
						err = ctx.Err()
					case <-tick.C:
					}
				}
			}
			if conn != nil {
				conn.Close(context.WithoutCancel(ctx))
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
