package gaps

import (
	"reflect"
	"testing"

	"github.com/jackc/pglogrepl"
)

func TestGaps(t *testing.T) {
	whole := func(s pglogrepl.LSN) []Chunk { return []Chunk{{S: s}} }
	for _, tc := range []struct {
		name string
		in   Ledger
		want []Gap
	}{
		{"never loaded, never streamed", Ledger{Watermark: 100}, []Gap{{0, 100, nil}}},
		{"never loaded, streamed since 40", Ledger{Spans: []Span{{40, 100}}, Watermark: 100}, []Gap{{0, 40, nil}}},
		{"loaded at S, streamed from S", Ledger{Chunks: whole(50), Spans: []Span{{50, 100}}, Watermark: 100}, nil},
		{"loaded at S, streamed from before S", Ledger{Chunks: whole(50), Spans: []Span{{30, 100}}, Watermark: 100}, nil},
		{"loaded at S, stream starts after S", Ledger{Chunks: whole(50), Spans: []Span{{60, 100}}, Watermark: 100}, []Gap{{50, 60, nil}}},
		{"slot lost between two segments", Ledger{Chunks: whole(10), Spans: []Span{{10, 40}, {70, 100}}, Watermark: 100}, []Gap{{40, 70, nil}}},
		{"segments touch", Ledger{Chunks: whole(10), Spans: []Span{{10, 40}, {40, 100}}, Watermark: 100}, nil},
		{"stream ended before the watermark", Ledger{Chunks: whole(10), Spans: []Span{{10, 40}}, Watermark: 100}, []Gap{{40, 100, nil}}},
		{"span beyond the watermark is clipped", Ledger{Chunks: whole(10), Spans: []Span{{10, 400}}, Watermark: 100}, nil},
		{"backfill newer than the watermark", Ledger{Chunks: whole(200), Watermark: 100}, nil},
		{"truncate voids older history", Ledger{Truncated: 60, Spans: []Span{{50, 100}}, Watermark: 100}, nil},
		{"truncate before a gap does not fill it", Ledger{Truncated: 20, Spans: []Span{{10, 30}, {50, 100}}, Watermark: 100}, []Gap{{30, 50, nil}}},
		{
			"resumed backfill: key ranges read at different S",
			Ledger{Chunks: []Chunk{{S: 30}, {S: 30}, {S: 70}}, Spans: []Span{{50, 100}}, Watermark: 100},
			[]Gap{{30, 50, []int{0, 1}}},
		},
		{
			"key ranges with nested gaps",
			Ledger{Chunks: []Chunk{{S: 10}, {S: 40}}, Spans: []Span{{60, 100}}, Watermark: 100},
			[]Gap{{10, 40, []int{0}}, {40, 60, nil}},
		},
		{"zero watermark", Ledger{Chunks: whole(5)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Find(tc.in)
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
