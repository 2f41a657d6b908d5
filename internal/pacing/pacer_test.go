package pacing

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// A rate limit holds the reads to it: 2,000 rows at 1,000 rows a second take at least 1.9 s (the
// first tenth of a second's worth is the burst), and bytes are limited alike through a Writer.
func TestTakeHoldsReadsToTheLimits(t *testing.T) {
	p := New(Limits{RowsPerSecond: 1000}, nil)
	began := time.Now()
	for range 20 {
		if err := p.Take(context.Background(), 100, 0); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(began); d < 1850*time.Millisecond {
		t.Errorf("2000 rows at 1000 rows/s took %s, want at least 1.9 s", d)
	}
	p.SetLimits(Limits{BytesPerSecond: 64 << 10})
	var out bytes.Buffer
	w := p.Writer(context.Background(), &out)
	began = time.Now()
	line := bytes.Repeat([]byte("x"), 1023)
	for range 128 { // 128 KiB at 64 KiB/s: 1.9 s past the burst
		if _, err := w.Write(append(line, '\n')); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d < 1850*time.Millisecond || out.Len() != 128<<10 || w.Waited() < time.Second {
		t.Errorf("128 KiB at 64 KiB/s took %s and wrote %d bytes, want at least 1.9 s and every byte", d, out.Len())
	}
	p.SetLimits(Limits{})
	began = time.Now()
	if err := p.Take(context.Background(), 1e9, 1e12); err != nil || time.Since(began) > time.Second {
		t.Errorf("no limit: %v after %s, want at once", err, time.Since(began))
	}
}

// A hold stops every read until it is released, and tells how long they waited, by cause.
func TestHoldStopsReadsUntilReleased(t *testing.T) {
	var waited []string
	p := New(Limits{}, func(cause string, _ time.Duration) { waited = append(waited, cause) })
	if !p.Hold(CauseWALBudget, "the slot holds too much") || p.Hold(CauseWALBudget, "again") {
		t.Fatal("Hold reports a new cause once")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := p.Take(ctx, 1, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Take while held: %v, want it to wait until its context ends", err)
	}
	if got := p.Holds()[CauseWALBudget]; got != "again" {
		t.Errorf("Holds: %q, want the latest why", got)
	}
	done := make(chan error)
	go func() { done <- p.Wait(context.Background()) }()
	if !p.Release(CauseWALBudget) || p.Release(CauseWALBudget) {
		t.Fatal("Release reports a held cause once")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The goroutine's Wait may begin after the release: only the first wait is sure.
	if len(waited) == 0 || waited[0] != CauseWALBudget {
		t.Errorf("waits told: %v, want one of %s first", waited, CauseWALBudget)
	}
	var nilPacer *Pacer
	if _, err := nilPacer.Writer(context.Background(), &bytes.Buffer{}).Write([]byte("x")); err != nil || nilPacer.Take(context.Background(), 1, 1) != nil {
		t.Errorf("a nil Pacer paces nothing: %v", err)
	}
}
