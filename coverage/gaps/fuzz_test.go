package gaps

import (
	"slices"
	"testing"

	"github.com/jackc/pglogrepl"
)

// ledgerFromBytes builds a small ledger over LSNs 0..255 from fuzz input: the watermark, the
// truncate LSN, the number of chunks and their S, then span bounds in pairs.
func ledgerFromBytes(b []byte) Ledger {
	next := func() pglogrepl.LSN {
		if len(b) == 0 {
			return 0
		}
		v := b[0]
		b = b[1:]
		return pglogrepl.LSN(v)
	}
	t := Ledger{Watermark: next(), Truncated: next()}
	if t.Truncated%3 != 0 {
		t.Truncated = 0 // most tables were never truncated
	}
	for n := int(next()) % 6; n > 0; n-- {
		t.Chunks = append(t.Chunks, Chunk{S: next()})
	}
	for len(b) >= 2 {
		t.Spans = append(t.Spans, Span{From: next(), To: next()})
	}
	return t
}

// missing is the reference: the key ranges (nil: the only one of a table without chunks) that
// miss LSN x, checked point by point.
func missing(t Ledger, x pglogrepl.LSN) []int {
	if x >= t.Watermark {
		return []int{}
	}
	for _, s := range t.Spans {
		if s.From <= x && x < s.To {
			return []int{}
		}
	}
	if len(t.Chunks) == 0 {
		if x < t.Truncated {
			return []int{}
		}
		return nil
	}
	out := []int{}
	for i, c := range t.Chunks {
		if x >= c.S && x >= t.Truncated {
			out = append(out, i)
		}
	}
	if len(out) == len(t.Chunks) {
		return nil
	}
	return out
}

// FuzzGaps checks Gaps against a point-by-point reference and its frontier invariants: gaps are
// sorted, disjoint, non-empty and maximal; a point is in a gap naming a key range exactly when no
// input covers that range there; adding a span or raising a backfill's S never adds a gap.
func FuzzGaps(f *testing.F) {
	f.Add([]byte{100, 0, 1, 50, 60, 100})
	f.Add([]byte{100, 60, 3, 30, 30, 70, 50, 100})
	f.Add([]byte{200, 0, 2, 10, 40, 60, 200, 10, 30, 20, 50})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := ledgerFromBytes(b)
		gaps := Find(in)
		for i, g := range gaps {
			if g.From >= g.To || g.To > in.Watermark {
				t.Fatalf("gap %d %v empty or beyond watermark %d", i, g, in.Watermark)
			}
			if i > 0 && (gaps[i-1].To > g.From || gaps[i-1].To == g.From && slices.Equal(gaps[i-1].Chunks, g.Chunks)) {
				t.Fatalf("gaps %v and %v overlap, are unsorted or not maximal", gaps[i-1], g)
			}
		}
		for x := pglogrepl.LSN(0); x < 256; x++ {
			want := missing(in, x)
			var got []int = []int{}
			for _, g := range gaps {
				if g.From <= x && x < g.To {
					got = g.Chunks
				}
			}
			if !slices.Equal(got, want) || (got == nil) != (want == nil) {
				t.Fatalf("at %d: gaps name %v, reference %v (ledger %+v, gaps %v)", x, got, want, in, gaps)
			}
		}
		// Monotone like a frontier: more coverage never makes a gap bigger.
		more := in
		more.Spans = append(slices.Clone(in.Spans), Span{From: in.Watermark / 3, To: in.Watermark / 2})
		more.Chunks = slices.Clone(in.Chunks)
		for i := range more.Chunks {
			more.Chunks[i].S += pglogrepl.LSN(i % 2 * 7)
		}
		if Total(Find(more)) > Total(gaps) {
			t.Fatalf("more coverage grew the gaps: %v → %v", gaps, Find(more))
		}
	})
}
