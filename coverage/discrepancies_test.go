package coverage

import (
	"testing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// The id is a pure function of its documented inputs: the same drift gives the same id, and
// each input changes it.
func TestDiscrepancyID(t *testing.T) {
	base := Discrepancy{Table: changebatch.TableName{Schema: "public", Name: "t"}, KeyColumns: []string{"a", "b"}, Key: []string{"1", "x"},
		Kind: "different", SourceHash: "00000000000000aa", TargetHash: "00000000000000bb",
		TargetVersion: changebatch.Version{LSN: 0x1000, Seq: 2}}
	if got := base.ID(); len(got) != 32 || got != base.ID() {
		t.Fatalf("ID() = %q, want 32 stable hex digits", got)
	}
	variants := map[string]func(*Discrepancy){
		"table":     func(d *Discrepancy) { d.Table.Name = "u" },
		"key":       func(d *Discrepancy) { d.Key = []string{"1", "y"} },
		"key split": func(d *Discrepancy) { d.Key = []string{"1x", ""} },
		"column":    func(d *Discrepancy) { d.KeyColumns = []string{"a", "c"} },
		"source":    func(d *Discrepancy) { d.SourceHash = "" },
		"target":    func(d *Discrepancy) { d.TargetHash = "00000000000000cc" },
		"version":   func(d *Discrepancy) { d.TargetVersion.Seq = 3 },
		"tombstone": func(d *Discrepancy) { d.TargetDeleted = true },
	}
	seen := map[string]string{base.ID(): "base"}
	for name, change := range variants {
		d := base
		d.Key = append([]string(nil), base.Key...)
		change(&d)
		if other, dup := seen[d.ID()]; dup {
			t.Errorf("changing the %s gives the id of %s", name, other)
		}
		seen[d.ID()] = name
	}
}
