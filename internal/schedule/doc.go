// Package schedule runs the daemon's cron-driven work while it streams: backfills of the
// streamed tables (--backfill-schedule) and of the tables kept by snapshots only
// (--snapshot-schedule) as Backfills, and verify runs (--verify-schedule) as Verifies. Each is a
// member of a streaming session's errgroup with Run(ctx) error; Parse reads a schedule spec
// (github.com/robfig/cron/v3, https://pkg.go.dev/github.com/robfig/cron/v3).
//
// Invariant: at most one run of a schedule is running at a time (a tick while the previous one
// runs is skipped), and a failed run never ends the session: it is logged and run again at the
// next tick. When the session ends, Run stops the schedule and returns only after a running run,
// cancelled with the session's context, returned.
package schedule
