package coverage

import (
	"reflect"
	"testing"

	"github.com/jackc/pglogrepl"
)

func TestGaps(t *testing.T) {
	whole := func(s pglogrepl.LSN) []Chunk { return []Chunk{{S: s}} }
	for _, tc := range []struct {
		name string
		in   TableLedger
		want []Gap
	}{
		{"never loaded, never streamed", TableLedger{Watermark: 100}, []Gap{{0, 100, nil}}},
		{"never loaded, streamed since 40", TableLedger{Spans: []Span{{40, 100}}, Watermark: 100}, []Gap{{0, 40, nil}}},
		{"loaded at S, streamed from S", TableLedger{Chunks: whole(50), Spans: []Span{{50, 100}}, Watermark: 100}, nil},
		{"loaded at S, streamed from before S", TableLedger{Chunks: whole(50), Spans: []Span{{30, 100}}, Watermark: 100}, nil},
		{"loaded at S, stream starts after S", TableLedger{Chunks: whole(50), Spans: []Span{{60, 100}}, Watermark: 100}, []Gap{{50, 60, nil}}},
		{"slot lost between two segments", TableLedger{Chunks: whole(10), Spans: []Span{{10, 40}, {70, 100}}, Watermark: 100}, []Gap{{40, 70, nil}}},
		{"segments touch", TableLedger{Chunks: whole(10), Spans: []Span{{10, 40}, {40, 100}}, Watermark: 100}, nil},
		{"stream ended before the watermark", TableLedger{Chunks: whole(10), Spans: []Span{{10, 40}}, Watermark: 100}, []Gap{{40, 100, nil}}},
		{"span beyond the watermark is clipped", TableLedger{Chunks: whole(10), Spans: []Span{{10, 400}}, Watermark: 100}, nil},
		{"backfill newer than the watermark", TableLedger{Chunks: whole(200), Watermark: 100}, nil},
		{"truncate voids older history", TableLedger{Truncated: 60, Spans: []Span{{50, 100}}, Watermark: 100}, nil},
		{"truncate before a gap does not fill it", TableLedger{Truncated: 20, Spans: []Span{{10, 30}, {50, 100}}, Watermark: 100}, []Gap{{30, 50, nil}}},
		{
			"resumed backfill: key ranges read at different S",
			TableLedger{Chunks: []Chunk{{S: 30}, {S: 30}, {S: 70}}, Spans: []Span{{50, 100}}, Watermark: 100},
			[]Gap{{30, 50, []int{0, 1}}},
		},
		{
			"key ranges with nested gaps",
			TableLedger{Chunks: []Chunk{{S: 10}, {S: 40}}, Spans: []Span{{60, 100}}, Watermark: 100},
			[]Gap{{10, 40, []int{0}}, {40, 60, nil}},
		},
		{"zero watermark", TableLedger{Chunks: whole(5)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Gaps(tc.in)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Gaps = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestGapBytes(t *testing.T) {
	gaps := []Gap{{From: 0x1000, To: 0x1800}, {From: 0x2000, To: 0x2001}}
	if got := Total(gaps); got != 0x801 {
		t.Fatalf("Total = %d, want %d", got, 0x801)
	}
}

func TestKeyRangesMergeAdjacentChunks(t *testing.T) {
	chunks := []Chunk{{Upper: []string{"10"}}, {Lower: []string{"10"}, Upper: []string{"20"}},
		{Lower: []string{"20"}, Upper: []string{"30"}}, {Lower: []string{"30"}}}
	got := DescribeKeys(chunks, []int{0, 1, 3})
	if want := "(-inf, 20] (30, +inf]"; got != want {
		t.Fatalf("DescribeKeys = %q, want %q", got, want)
	}
	if r := keyRanges(chunks, nil); r != nil {
		t.Fatalf("keyRanges(nil) = %v, want nil (every key)", r)
	}
}

func TestFormatKeyRangesQuotesAmbiguousValues(t *testing.T) {
	got := FormatKeyRanges([]KeyRange{{Lower: []string{"1", "a,b"}, Upper: []string{"2", ""}}})
	if want := `((1,"a,b"), (2,"")]`; got != want {
		t.Fatalf("FormatKeyRanges = %s, want %s", got, want)
	}
}

// A block plan's chunks are named by their blocks, adjacent ones merged as key ranges are.
func TestBlockRangesAreNamedByBlocks(t *testing.T) {
	chunks := []Chunk{{Lower: []string{"0"}, Upper: []string{"8"}, Blocks: true},
		{Lower: []string{"8"}, Upper: []string{"16"}, Blocks: true}, {Lower: []string{"16"}, Blocks: true}}
	if got, want := DescribeKeys(chunks, []int{0, 1}), "blocks [0, 16)"; got != want {
		t.Errorf("DescribeKeys = %q, want %q", got, want)
	}
	if got, want := DescribeKeys(chunks, []int{2}), "blocks [16, +inf)"; got != want {
		t.Errorf("DescribeKeys = %q, want %q", got, want)
	}
}
