package main

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// readiness is what /readyz answers: ready while the daemon streams (engine.Monitor.FollowStream
// was called with a streamer, and not with nil since), else the one-line reason why not. The
// metrics Monitor moves it; its methods are safe for concurrent use.
type readiness struct {
	mu     sync.Mutex
	ready  bool
	reason string    // why not ready; "" while ready
	since  time.Time // when the current state began
}

// newReadiness returns a readiness that is not ready: the daemon is starting.
func newReadiness() *readiness {
	return &readiness{reason: "starting: the daemon has not streamed yet (connecting, checking the source, preparing the target, the publication and the slot)", since: time.Now()}
}

// set moves to ready, or to not ready for reason, from now on (unless nothing changes).
func (r *readiness) set(ready bool, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ready == ready && r.reason == reason {
		return
	}
	r.ready, r.reason, r.since = ready, reason, time.Now()
}

// following is called with FollowStream: streaming when a stream is followed, else its end.
func (r *readiness) following(streaming bool) {
	if streaming {
		r.set(true, "")
		return
	}
	r.set(false, "the stream stopped: the session is ending (restarting, reconnecting after an error, or shutting down)")
}

// loading is called when a backfill run of trigger starts (BackfillProgress): before streaming it
// is a load of tables; a backfill while the daemon streams (a schedule) changes nothing.
func (r *readiness) loading(trigger string) {
	r.mu.Lock()
	streaming := r.ready
	r.mu.Unlock()
	if !streaming {
		r.set(false, fmt.Sprintf("loading tables before streaming (backfill trigger %s; pgconverge status shows its chunks)", trigger))
	}
}

// retrying is called with SessionRetried: the session failed for reason and the next one starts
// after a backoff, or (reason "overlap") the session waits for a table a daemon of another slot
// follows (streaming its other tables, if any).
func (r *readiness) retrying(reason string) {
	if reason == "overlap" {
		r.set(false, "waiting: a selected table is followed by a running daemon of another slot (the log's ERROR lines starting \"waiting\" name it and the fix; the daemon follows its other tables meanwhile)")
		return
	}
	if reason == "restart" {
		r.set(false, "restarting the session on purpose (a schema, publication or slot change; the log's INFO line \"restarting the session to follow a change on the source\" says which)")
		return
	}
	r.set(false, fmt.Sprintf("reconnecting after an error (reason %s; the log's ERROR line \"session failed, reconnecting\" names it and the fix)", reason))
}

// state returns whether the daemon is ready, why not, and since when.
func (r *readiness) state() (bool, string, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready, r.reason, r.since
}

// healthz answers /healthz: 200 "ok" while the process serves.
func healthz(w http.ResponseWriter, _ *http.Request) {
	plain(w, http.StatusOK, "ok")
}

// readyz answers /readyz: 200 "ok: streaming" while the daemon streams, else 503 with
// "not ready: " and the reason, with how long it has lasted.
func (r *readiness) readyz(w http.ResponseWriter, _ *http.Request) {
	ready, reason, since := r.state()
	if ready {
		plain(w, http.StatusOK, fmt.Sprintf("ok: streaming for %s", time.Since(since).Round(time.Second)))
		return
	}
	plain(w, http.StatusServiceUnavailable, fmt.Sprintf("not ready: %s, for %s", reason, time.Since(since).Round(time.Second)))
}

// plain writes a one-line, uncached text/plain response.
func plain(w http.ResponseWriter, code int, line string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	fmt.Fprintln(w, line)
}
