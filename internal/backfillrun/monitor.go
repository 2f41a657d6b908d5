package backfillrun

import (
	"github.com/pgconverge/pgconverge/apply"
)

// Monitor receives what backfill runs count, for metrics. Methods are called from several
// goroutines and must not block. Table names are as changebatch.TableName.String prints them.
type Monitor interface {
	// BackfillChunk counts one committed backfill chunk of table: rows read, and what was written.
	BackfillChunk(table string, read int64, rows apply.RowCounts)
	// BackfillConflict counts one backfill transaction of table that lost a deadlock or a
	// serialization conflict and is retried.
	BackfillConflict(table string)
	// BackfillReadSplit counts a split of table's reads: a read passed the time cap
	// (Job.ChunkTimeCap), and the next ones take half as many rows.
	BackfillReadSplit(table string)
}

// nopMonitor counts nothing: the Monitor of a Job without one.
type nopMonitor struct{}

func (nopMonitor) BackfillChunk(string, int64, apply.RowCounts) {}
func (nopMonitor) BackfillConflict(string)                      {}
func (nopMonitor) BackfillReadSplit(string)                     {}
