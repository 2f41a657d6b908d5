package engine

import (
	"fmt"
	"testing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Keys waiting to be filled are merged per table, and a key left unknown twice is read once.
func TestUnknownKeysAreMergedAndDistinct(t *testing.T) {
	a := changebatch.Table{TableName: changebatch.TableName{Schema: "public", Name: "a"}}
	b := changebatch.Table{TableName: changebatch.TableName{Schema: "public", Name: "b"}}
	queue := make(chan unknownKeys, 4)
	queue <- unknownKeys{table: b, keys: [][]string{{"1"}}}
	queue <- unknownKeys{table: a, keys: [][]string{{"2"}, {"1"}}}
	got := drainUnknown(unknownKeys{table: a, keys: [][]string{{"1"}}}, queue)
	if len(got) != 2 || got[0].table.Name != "a" || got[1].table.Name != "b" {
		t.Fatalf("merged into %v, want a then b", got)
	}
	if k := fmt.Sprint(distinctKeys(got[0].keys)); k != "[[1] [2]]" {
		t.Errorf("distinct keys of a: %s, want [[1] [2]]", k)
	}
	if k := fmt.Sprint(distinctKeys([][]string{{"x", "y"}, {"xy", ""}, {"x", "y"}})); k != "[[x y] [xy ]]" {
		t.Errorf("distinct composite keys: %q", k)
	}
}
