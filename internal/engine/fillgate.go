package engine

import "sync/atomic"

// fillGate counts the fills of unknown values under way (unknownFiller), whose snapshot may be
// older than a tombstone horizon: a tombstone such a fill could still need must stay. The filler's
// goroutine calls begin before it takes a fill's snapshot and end when the fill is over; the
// tombstone pruner's goroutine asks busy before each table it prunes, and leaves the rest of its
// round to the next one while a fill is under way. The zero value is a gate with no fill.
type fillGate struct {
	filling atomic.Int32
}

// begin notes a fill about to take its snapshot.
func (g *fillGate) begin() { g.filling.Add(1) }

// end notes that a fill begun with begin is over, written or failed.
func (g *fillGate) end() { g.filling.Add(-1) }

// busy reports whether a fill is under way.
func (g *fillGate) busy() bool { return g.filling.Load() > 0 }
