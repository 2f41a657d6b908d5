package pgsession

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// SlotWaitAfter is how long a slot's creation waits before WatchSlotCreation first reports it;
// SlotWaitEvery how often it reports after that.
const (
	SlotWaitAfter = 5 * time.Second
	SlotWaitEvery = 5 * time.Second
)

// SlotWait is a replication slot's creation that waits: creating a logical slot waits until every
// transaction that holds a transaction id when it starts has ended (the snapshot builder's
// consistent point: PostgreSQL docs §47.2.5 and snapbuild.c), so one long transaction on the
// source stops it, silently. Waited is how long it has waited; Blockers the source backends it
// waits for (pg_blocking_pids of the creating walsender), none when it waits for something else
// (a standby waiting for its primary's running-transactions record).
type SlotWait struct {
	Slot     string
	Waited   time.Duration
	Blockers []Blocker
}

// Blocker is a source backend a slot's creation waits for, as pg_stat_activity shows it; Query is
// its current or last statement, cut to 200 characters.
type Blocker struct {
	PID         int32      `json:"pid"`
	Application string     `json:"application"`
	User        string     `json:"user"`
	State       string     `json:"state"`
	XactStart   *time.Time `json:"xact_start"`
	Query       string     `json:"query"`
}

// BlockersOf returns the backends that backend pid waits for (pg_blocking_pids), read on conn.
func BlockersOf(ctx context.Context, conn *pgx.Conn, pid uint32) ([]Blocker, error) {
	rows, err := conn.Query(ctx, `select b.pid, coalesce(b.application_name, ''), coalesce(b.usename::text, ''), coalesce(b.state, ''),
  b.xact_start, left(coalesce(b.query, ''), 200)
from unnest(pg_blocking_pids($1)) p join pg_stat_activity b on b.pid = p order by b.xact_start`, int32(pid))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Blocker])
}

// WatchSlotCreation reports, with report, the creation of slot by the replication backend pid of
// sourceURL while it lasts: first after SlotWaitAfter, then every SlotWaitEvery, until the
// returned stop is called (or ctx ends), reading the blockers on a connection of its own, opened
// only once it waited SlotWaitAfter. A failure to read them is reported as a wait without
// blockers.
func WatchSlotCreation(ctx context.Context, sourceURL, slot string, pid uint32, report func(SlotWait)) (stop func()) {
	if report == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	started := time.Now()
	go func() {
		defer close(done)
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.WithoutCancel(ctx))
			}
		}()
		wait := SlotWaitAfter
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = SlotWaitEvery
			w := SlotWait{Slot: slot, Waited: time.Since(started)}
			if conn == nil {
				conn, _ = Connect(ctx, sourceURL, "source")
			}
			if conn != nil {
				var err error
				if w.Blockers, err = BlockersOf(ctx, conn, pid); err != nil && ctx.Err() == nil {
					conn.Close(context.WithoutCancel(ctx))
					conn = nil
				}
			}
			if ctx.Err() == nil {
				report(w)
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// slotWaitLogEvery is how often LogSlotWait logs a wait whose blockers stay the same.
const slotWaitLogEvery = time.Minute

// LogSlotWait returns a report for WatchSlotCreation that logs a wait at WARN on log, with the
// backends it waits for and the fix: the first report, then whenever those backends change, and
// once a minute while they do not. It returns nil for a nil log.
func LogSlotWait(log *slog.Logger) func(SlotWait) {
	if log == nil {
		return nil
	}
	var logged time.Time
	var last []int32
	return func(w SlotWait) {
		pids := make([]int32, len(w.Blockers))
		for i, b := range w.Blockers {
			pids[i] = b.PID
		}
		if slices.Equal(pids, last) && time.Since(logged) < slotWaitLogEvery {
			return
		}
		logged, last = time.Now(), pids
		attrs := []any{"slot", w.Slot, "waited_seconds", int(w.Waited.Seconds())}
		for _, b := range w.Blockers {
			start := ""
			if b.XactStart != nil {
				start = b.XactStart.UTC().Format(time.RFC3339)
			}
			attrs = append(attrs, slog.Group("waits_for", "pid", b.PID, "application", b.Application, "user", b.User,
				"state", b.State, "xact_start", start, "query", b.Query))
		}
		log.Warn("creating the replication slot waits for transactions open on the source: it goes on waiting; end them (COMMIT or ROLLBACK, or SELECT pg_terminate_backend(pid) on the source) to let it go on", attrs...)
	}
}
