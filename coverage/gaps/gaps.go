// Package gaps is the coverage arithmetic, pure and without SQL: from what the ledger holds about
// one table (its latest backfill's chunks at their snapshot LSNs, the stream's spans, a TRUNCATE,
// the watermark) it finds the LSN ranges no path covered, for the key ranges they miss.
//
// Invariant: an LSN below the watermark is in a gap for a key range exactly when no chunk of that
// range was read at a snapshot above it, no TRUNCATE above it voided it, and no stream span holds
// it (fuzzed against a reference that checks every LSN: FuzzGaps).
package gaps

import (
	"slices"

	"github.com/jackc/pglogrepl"
)

// Span is a half-open LSN range [From, To): the stream applied every change of a table whose
// commit LSN falls in it.
type Span struct {
	From, To pglogrepl.LSN
}

// Chunk is one key range (Lower, Upper] of a completed backfill, in the source key's order, as
// key column values in text form (nil bound = unbounded), and the snapshot LSN S its rows were
// read at: the backfill delivered the range's history of every commit LSN below S. A chunk of a
// block plan (Blocks) is instead the rows stored in blocks [Lower, Upper) of the source table at
// S, one block number each.
type Chunk struct {
	Lower, Upper []string
	Blocks       bool
	S            pglogrepl.LSN
}

// Ledger is what the ledger holds about one table, the input of Find.
type Ledger struct {
	// Chunks are the key ranges of the table's latest completed backfill in key order; together
	// they cover every key. Empty when the table never completed one.
	Chunks []Chunk
	// Truncated is the LSN of the latest TRUNCATE the stream applied to the table (0: none): every
	// older change is void, so history below it is covered for every key.
	Truncated pglogrepl.LSN
	// Spans are the ranges the stream covered the table, in any order, possibly overlapping.
	Spans []Span
	// Watermark is the end of coverage asked about: history at and above it is not due yet.
	Watermark pglogrepl.LSN
}

// Gap is an LSN range [From, To) of a table that no backfill and no stream span covered, for the
// key ranges it names.
type Gap struct {
	From, To pglogrepl.LSN
	// Chunks are the indexes in Ledger.Chunks of the key ranges that miss the range, in
	// order; nil means every key.
	Chunks []int
}

// Bytes returns the size of the gap in bytes of WAL.
func (g Gap) Bytes() uint64 { return uint64(g.To - g.From) }

// Find returns the ranges below t.Watermark that t's ledger leaves uncovered, sorted and disjoint;
// adjacent gaps differ in the key ranges they name. A key range is covered at LSN x when its
// backfill chunk was read at S > x, a streamed TRUNCATE at T > x voided everything older, or a
// stream span holds x (docs/design.md, "Coverage"). Like a span frontier (CockroachDB's
// span.Frontier), each key range's backfill frontier is max(S, Truncated), and the table's gaps are
// the ranges between each frontier and the watermark that no span fills.
func Find(t Ledger) []Gap {
	frontiers := []pglogrepl.LSN{t.Truncated}
	if len(t.Chunks) > 0 {
		frontiers = frontiers[:0]
		for _, c := range t.Chunks {
			frontiers = append(frontiers, max(c.S, t.Truncated))
		}
	}
	spans := mergeSpans(t.Spans, t.Watermark)
	// Elementary intervals between consecutive boundaries have one coverage each.
	bounds := []pglogrepl.LSN{t.Watermark}
	for _, f := range frontiers {
		if f < t.Watermark {
			bounds = append(bounds, f)
		}
	}
	for _, s := range spans {
		bounds = append(bounds, s.From, s.To)
	}
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	var gaps []Gap
	for i := 0; i+1 < len(bounds); i++ {
		from, to := bounds[i], bounds[i+1]
		if streamed(spans, from) {
			continue
		}
		var missing []int
		for k, f := range frontiers {
			if f <= from {
				missing = append(missing, k)
			}
		}
		if len(missing) == 0 {
			continue
		}
		if len(missing) == len(frontiers) {
			missing = nil
		}
		if n := len(gaps); n > 0 && gaps[n-1].To == from && slices.Equal(gaps[n-1].Chunks, missing) {
			gaps[n-1].To = to
			continue
		}
		gaps = append(gaps, Gap{From: from, To: to, Chunks: missing})
	}
	return gaps
}

// mergeSpans returns spans clipped to [0, end), without empty ones, sorted and merged.
func mergeSpans(in []Span, end pglogrepl.LSN) []Span {
	var out []Span
	for _, s := range in {
		s.To = min(s.To, end)
		if s.From < s.To {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b Span) int { return cmpLSN(a.From, b.From) })
	merged := out[:0]
	for _, s := range out {
		if n := len(merged); n > 0 && s.From <= merged[n-1].To {
			merged[n-1].To = max(merged[n-1].To, s.To)
			continue
		}
		merged = append(merged, s)
	}
	return merged
}

// streamed reports whether x lies in one of the sorted, disjoint spans.
func streamed(spans []Span, x pglogrepl.LSN) bool {
	i, _ := slices.BinarySearchFunc(spans, x, func(s Span, x pglogrepl.LSN) int {
		switch {
		case s.To <= x:
			return -1
		case s.From > x:
			return 1
		}
		return 0
	})
	return i < len(spans) && spans[i].From <= x && x < spans[i].To
}

func cmpLSN(a, b pglogrepl.LSN) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Total returns the bytes of WAL the gaps span.
func Total(gaps []Gap) uint64 {
	var n uint64
	for _, g := range gaps {
		n += g.Bytes()
	}
	return n
}
