package backfillrun

import (
	"time"
)

// minReadLimit is the fewest rows a split read takes: below it a read's time is its round trips'
// and the snapshot import's, which splitting further cannot shorten.
const minReadLimit = 100

// readLimit returns the most rows one read of cw's chunk takes: the table's readLimit once a read
// passed the time cap, 0 (all) before, and always for a chunk without a key order to continue
// after (a block chunk, a keyless table's).
func (cw chunkWork) readLimit() int {
	if cw.chunk.ByBlock || cw.tr.t.Keyless {
		return 0
	}
	cw.tr.mu.Lock()
	defer cw.tr.mu.Unlock()
	return cw.tr.readLimit
}

// checkTimeCap splits the further reads of cw's table when a read of rows rows took longer than
// the time cap (Job.ChunkTimeCap), took counting the time spent on the source and the target, not
// the waits for the pacer or, in a merge, for the batches' apply: each then takes at most half as many rows (no fewer than
// minReadLimit), and the table's chunks are merged in parts instead of copied whole. It logs each
// split at INFO and counts it (Monitor.BackfillReadSplit).
func (w *backfillWorker) checkTimeCap(cw chunkWork, took time.Duration, rows int64) {
	if w.timeCap <= 0 || took <= w.timeCap || cw.chunk.ByBlock || cw.tr.t.Keyless {
		return
	}
	limit := max(int(rows/2), minReadLimit)
	tr := cw.tr
	tr.mu.Lock()
	split := tr.readLimit == 0 || limit < tr.readLimit
	if split {
		tr.readLimit = limit
	}
	tr.mu.Unlock()
	if !split {
		return
	}
	w.mon.BackfillReadSplit(tr.t.String())
	w.log.Info("a chunk read took longer than the time cap: further reads of the table take at most this many rows each",
		"table", tr.t.String(), "chunk", cw.ordinal, "rows", rows, "seconds", took.Seconds(), "time_cap_seconds", w.timeCap.Seconds(), "rows_per_read", limit)
}
