package pgtest

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// logWriter sends log lines to t.Log until the test ends.
type logWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

// LogWriter returns a writer that sends each line written to t.Log, until the test ends (a
// daemon still logging after it would make the test runner panic): for slog handlers.
func LogWriter(t *testing.T) io.Writer {
	w := &logWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return w
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// Running is a long-running function (a daemon) in a goroutine of the test.
type Running struct {
	cancel context.CancelFunc
	done   chan error
}

// Start runs fn in a goroutine with a context that Stop cancels (as SIGTERM would); it is stopped
// at cleanup at the latest.
func Start(t *testing.T, fn func(ctx context.Context) error) *Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &Running{cancel: cancel, done: make(chan error, 1)}
	go func() { d.done <- fn(ctx) }()
	t.Cleanup(func() { d.Stop(t) })
	return d
}

// Stop cancels the function and requires it to return nil within 30 s.
func (d *Running) Stop(t *testing.T) {
	t.Helper()
	if d.cancel == nil {
		return
	}
	d.cancel()
	d.cancel = nil
	select {
	case err := <-d.done:
		if err != nil {
			t.Errorf("daemon stopped with error: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("daemon did not stop within 30 s of cancellation")
	}
}

// WaitExit waits up to timeout for the function to return on its own and returns its error.
func (d *Running) WaitExit(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-d.done:
		d.cancel = nil
		return err
	case <-time.After(timeout):
		t.Fatalf("daemon still runs after %s", timeout)
		return nil
	}
}

// RequireRunning fails the test if the function has returned.
func (d *Running) RequireRunning(t *testing.T) {
	t.Helper()
	select {
	case err := <-d.done:
		d.cancel = nil
		t.Fatalf("daemon exited: %v", err)
	default:
	}
}

// SyncBuffer is a log destination a test reads (String) while the daemon's goroutines, or a child
// process's output copier, write to it; safe for concurrent use.
type SyncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (w *SyncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String returns everything written so far.
func (w *SyncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
