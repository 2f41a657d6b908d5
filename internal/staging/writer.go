package staging

import (
	"context"
	"sync"
)

// writer runs a Table's statements on its connection, in the order they were asked for, in a
// goroutine of its own: StageRows only queues its COPY (at most writerQueue ahead), so that the
// stream decodes the next changes while the target writes these; every other call waits for its
// statement, and so for every COPY queued before it. The first error of a queued COPY is returned
// by every call after it: the stream's session then ends, and the next one clears the staging.
type writer struct {
	ops  chan func()
	done chan struct{}
	mu   sync.Mutex
	err  error
}

// writerQueue is how many row COPYs may wait for the connection (each of at most about 4 MiB of
// rows, cdc's batch).
const writerQueue = 2

func newWriter() *writer {
	w := &writer{ops: make(chan func(), writerQueue), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for op := range w.ops {
			op()
		}
	}()
	return w
}

// failed returns the first error of a queued op.
func (w *writer) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// queue has fn run after the ops queued before it, and returns at once (after waiting for room in
// the queue); fn does not run once a queued op failed.
func (w *writer) queue(ctx context.Context, fn func() error) error {
	if err := w.failed(); err != nil {
		return err
	}
	op := func() {
		if w.failed() != nil {
			return
		}
		if err := fn(); err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
		}
	}
	select {
	case w.ops <- op:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run runs fn after the ops queued before it and returns its error, or the first error of a
// queued op.
func (w *writer) run(ctx context.Context, fn func() error) error {
	res := make(chan error, 1)
	op := func() {
		if err := w.failed(); err != nil {
			res <- err
			return
		}
		res <- fn()
	}
	select {
	case w.ops <- op:
	case <-ctx.Done():
		return ctx.Err()
	}
	// Once queued, fn is waited for even when ctx ends: it uses the caller's memory, and its
	// statement ends with ctx (pgx cancels it).
	return <-res
}

// close waits for the queued ops and stops the goroutine.
func (w *writer) close() {
	close(w.ops)
	<-w.done
}
