package backfillrun

import (
	"github.com/pgconverge/pgconverge/apply"
)

// Monitor receives what backfill runs count, for metrics. Methods are called from several
// goroutines and must not block. Table names are as changebatch.TableName.String prints them.
type Monitor interface {
	// BackfillChunk counts one committed backfill chunk of table: rows read, and what was written.
	BackfillChunk(table string, read int64, rows RowCounts)
	// BackfillConflict counts one backfill transaction of table that lost a deadlock or a
	// serialization conflict and is retried.
	BackfillConflict(table string)
}

// RowCounts are the rows an apply wrote (inserted, updated or made tombstones) and the changes the
// version rule turned into no-ops because the target held the same or a newer version.
type RowCounts struct{ Applied, Suppressed int64 }

// Counts returns the rows of an apply's result r.
func Counts(r apply.Result) RowCounts {
	return RowCounts{Applied: r.Applied, Suppressed: r.Suppressed}
}

// nopMonitor counts nothing: the Monitor of a Job without one.
type nopMonitor struct{}

func (nopMonitor) BackfillChunk(string, int64, RowCounts) {}
func (nopMonitor) BackfillConflict(string)                {}
