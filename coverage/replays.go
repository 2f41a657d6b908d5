package coverage

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// The audit of suppressed replays (migrations/006_suppressed_replays.sql): one row per target
// transaction and table in which a replay had no effect, written in that transaction.

// Replay paths of SuppressedReplay.Path.
const (
	ReplayStream = "stream"
	ReplayVerify = "verify"
)

// DefaultAuditRetention is how long suppressed-replay rows are kept unless told otherwise
// (`--audit-retention`).
const DefaultAuditRetention = 30 * 24 * time.Hour

// SuppressedReplay is one table's suppressed replay in one target transaction.
type SuppressedReplay struct {
	// Path is ReplayStream or ReplayVerify; Slot is the stream's slot, VerifyRun the verify run.
	Path      string
	Slot      string
	VerifyRun int64
	Table     changebatch.TableName
	// First and Last bound the window replayed: the LSNs of the versions the stream offered, or
	// for verify the snapshot the known discrepancies were first found at and the run's.
	First, Last pglogrepl.LSN
	// Offered counts the rows offered (changes, or discrepancies found); Suppressed those that
	// had no effect, 1 ≤ Suppressed ≤ Offered.
	Offered, Suppressed int64
}

// RecordSuppressedReplays inserts rs through q, which must be the transaction whose effects they
// describe (the stream's apply transaction): the rows carry its transaction id. Rows with
// nothing suppressed are left out; none at all is a no-op.
func RecordSuppressedReplays(ctx context.Context, q Execer, rs []SuppressedReplay) error {
	var paths, slots, tables, firsts, lasts []string
	var runs []*int64
	var offered, suppressed []int64
	for _, r := range rs {
		if r.Suppressed <= 0 {
			continue
		}
		paths, slots, tables = append(paths, r.Path), append(slots, r.Slot), append(tables, r.Table.String())
		firsts, lasts = append(firsts, r.First.String()), append(lasts, r.Last.String())
		var run *int64
		if r.Path == ReplayVerify {
			run = &r.VerifyRun
		}
		runs = append(runs, run)
		offered, suppressed = append(offered, r.Offered), append(suppressed, r.Suppressed)
	}
	if len(paths) == 0 {
		return nil
	}
	_, err := q.Exec(ctx, `insert into pgconverge.suppressed_replays
  (path, slot, verify_run, table_name, first_lsn, last_lsn, rows_offered, rows_suppressed)
select path, nullif(slot, ''), verify_run, table_name, first_lsn, last_lsn, offered, suppressed
from unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::pg_lsn[], $6::pg_lsn[], $7::int8[], $8::int8[])
  as r(path, slot, verify_run, table_name, first_lsn, last_lsn, offered, suppressed)`,
		paths, slots, runs, tables, firsts, lasts, offered, suppressed)
	if err != nil {
		return fmt.Errorf("record %d suppressed replays in the audit: %w", len(paths), err)
	}
	return nil
}

// PruneSuppressedReplays deletes the audit rows recorded more than retention ago and returns how
// many it deleted; retention 0 keeps every row.
func PruneSuppressedReplays(ctx context.Context, q Execer, retention time.Duration) (int64, error) {
	if retention <= 0 {
		return 0, nil
	}
	// Seconds times an interval: PostgreSQL 14 cannot read 720 hours as "2592000000000 microseconds".
	tag, err := q.Exec(ctx, `delete from pgconverge.suppressed_replays where recorded_at < now() - $1::float8 * interval '1 second'`,
		retention.Seconds())
	if err != nil {
		return 0, fmt.Errorf("delete the suppressed-replay audit rows older than %s: %w", retention, err)
	}
	return tag.RowsAffected(), nil
}
