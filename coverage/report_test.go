package coverage

import (
	"testing"

	"github.com/pgconverge/pgconverge/coverage/gaps"
)

func TestKeyRangesMergeAdjacentChunks(t *testing.T) {
	chunks := []gaps.Chunk{{Upper: []string{"10"}}, {Lower: []string{"10"}, Upper: []string{"20"}},
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
	chunks := []gaps.Chunk{{Lower: []string{"0"}, Upper: []string{"8"}, Blocks: true},
		{Lower: []string{"8"}, Upper: []string{"16"}, Blocks: true}, {Lower: []string{"16"}, Blocks: true}}
	if got, want := DescribeKeys(chunks, []int{0, 1}), "blocks [0, 16)"; got != want {
		t.Errorf("DescribeKeys = %q, want %q", got, want)
	}
	if got, want := DescribeKeys(chunks, []int{2}), "blocks [16, +inf)"; got != want {
		t.Errorf("DescribeKeys = %q, want %q", got, want)
	}
}
