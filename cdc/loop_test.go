package cdc

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"
)

// The receive loop's invariants, tested against a fake server and target in fake time
// (fakeserver_test.go). Every test also checks each status update's bounds (checkFlushBounds).

// wantStatuses checks the instants (after the loop's start) and reply flags of the status
// updates sent.
func wantStatuses(t *testing.T, r *loopRun, sts []sentStatus, want map[time.Duration]bool) {
	t.Helper()
	got := map[time.Duration]bool{}
	for _, st := range sts {
		got[r.since(st.at)] = st.ReplyRequested
	}
	if !maps.Equal(got, want) || len(sts) != len(want) {
		t.Errorf("status updates (instant: reply requested) = %v (%d), want %v", got, len(sts), want)
	}
}

func TestLoopFlushNeverExceedsCommitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &fakeSink{gate: make(chan struct{})}
		r := startLoop(t, sink, nil)
		c1 := loopStart + 0x100
		r.srv.send(txn(c1, 1, 3)...)
		time.Sleep(25 * time.Second) // the target holds the group meanwhile
		synctest.Wait()
		if st := r.s.Stats(); st.Flushed != loopStart || st.Received != txnEnd(c1) {
			t.Errorf("while the target applies: flushed %s received %s, want %s %s", st.Flushed, st.Received, loopStart, txnEnd(c1))
		}
		wantStatuses(t, r, r.srv.sent(), map[time.Duration]bool{0: false, 10 * time.Second: true, 20 * time.Second: true})
		sink.gate <- struct{}{}
		synctest.Wait()
		sts := r.srv.sent()
		if last := sts[len(sts)-1]; last.WALFlushPosition != txnEnd(c1) || r.since(last.at) != 25*time.Second {
			t.Errorf("after the commit: last status flush %s at %s, want %s at once (25s)", last.WALFlushPosition, r.since(last.at), txnEnd(c1))
		}
		if err := r.stop(); err != nil {
			t.Fatalf("stream returned %v after its context ended, want nil", err)
		}
		sts = r.srv.sent()
		if last := sts[len(sts)-1]; last.WALFlushPosition != txnEnd(c1) || r.s.Stats().Confirmed != txnEnd(c1) {
			t.Errorf("final status flush %s, confirmed %s, want %s", last.WALFlushPosition, r.s.Stats().Confirmed, txnEnd(c1))
		}
		checkFlushBounds(t, sts)
	})
}

func TestLoopConfirmLimitBoundsFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var limit atomic.Uint64 // 0: below Start, which counts as Start
		r := startLoop(t, &fakeSink{}, func(c *StreamConfig) {
			c.ConfirmLimit = func() pglogrepl.LSN { return pglogrepl.LSN(limit.Load()) }
		})
		c1, c2 := loopStart+0x100, loopStart+0x200
		r.srv.send(append(txn(c1, 1, 1), txn(c2, 2, 1)...)...)
		// Off the loop's confirmEvery ticks, so that which of two goroutines runs first at one
		// instant does not decide the outcome.
		time.Sleep(5550 * time.Millisecond)
		if st := r.s.Stats(); st.Flushed != txnEnd(c2) || st.Confirmed != loopStart {
			t.Errorf("flushed %s confirmed %s, want %s %s", st.Flushed, st.Confirmed, txnEnd(c2), loopStart)
		}
		n := len(r.srv.sent())
		limit.Store(uint64(txnEnd(c1)))
		time.Sleep(2 * time.Second) // at 7.55 s
		limit.Store(uint64(txnEnd(c2) + 0x1000))
		time.Sleep(2 * time.Second) // at 9.55 s
		sts := r.srv.sent()[n:]
		if len(sts) != 2 || sts[0].WALFlushPosition != txnEnd(c1) || r.since(sts[0].at) != 5600*time.Millisecond ||
			sts[1].WALFlushPosition != txnEnd(c2) || r.since(sts[1].at) != 7600*time.Millisecond {
			t.Errorf("after raising the limit at 5.55 s and 7.55 s: %+v, want flush %s at 5.6 s and %s (the committed position) at 7.6 s, the next confirmEvery tick",
				sts, txnEnd(c1), txnEnd(c2))
		}
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		checkFlushBounds(t, r.srv.sent())
	})
}

func TestLoopGroupCommitKeepsTransactionsWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &fakeSink{gate: make(chan struct{})}
		var groups atomic.Int32
		r := startLoop(t, sink, func(c *StreamConfig) { c.Knobs.OnGroup = func(int, bool) { groups.Add(1) } })
		c1, c2, c3, c4 := loopStart+0x100, loopStart+0x200, loopStart+0x300, loopStart+0x400
		r.srv.send(txn(c1, 1, 2)...) // applied at once: the target is free
		synctest.Wait()
		r.srv.send(txn(c2, 10, 3)...) // these grow the next group meanwhile
		r.srv.send(txn(c3, 20, 1)...)
		r.srv.send(txnBegin(c4, 30, 2)...)
		synctest.Wait()
		sink.gate <- struct{}{}
		synctest.Wait()
		if g := groups.Load(); g != 1 {
			t.Errorf("%d groups formed while a transaction was open, want 1: the open one is never split off", g)
		}
		r.srv.send(txnCommit(c4))
		synctest.Wait()
		sink.gate <- struct{}{}
		synctest.Wait()
		calls := sink.applied()
		want := []applyCall{{end: txnEnd(c1), rows: map[pglogrepl.LSN]int{c1: 2}},
			{end: txnEnd(c4), rows: map[pglogrepl.LSN]int{c2: 3, c3: 1, c4: 2}}}
		checkCalls(t, calls, want)
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		checkFlushBounds(t, r.srv.sent())
	})
}

// checkCalls compares the sink's calls by end and rows per transaction.
func checkCalls(t *testing.T, got, want []applyCall) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].end == want[i].end && maps.Equal(got[i].rows, want[i].rows)
	}
	if !ok {
		var b strings.Builder
		for _, c := range got {
			fmt.Fprintf(&b, "{end %s rows %v} ", c.end, c.rows)
		}
		t.Errorf("apply calls = %s, want %v", b.String(), want)
	}
}

func TestLoopGroupAtLimitWaitsForTheTarget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &fakeSink{gate: make(chan struct{})}
		r := startLoop(t, sink, func(c *StreamConfig) { c.GroupRows, c.HeadGroupRows = 4, 4 })
		c1, c2, c3, c4 := loopStart+0x100, loopStart+0x200, loopStart+0x300, loopStart+0x400
		r.srv.send(txn(c1, 1, 1)...)
		r.srv.send(txn(c2, 10, 3)...)
		r.srv.send(txn(c3, 20, 3)...) // the group passes 4 rows: the loop waits for the target
		r.srv.send(txn(c4, 30, 1)...)
		time.Sleep(35 * time.Second)
		if st := r.s.Stats(); st.Received != txnEnd(c3) {
			t.Errorf("received %s while the group waited, want %s: nothing more is read", st.Received, txnEnd(c3))
		}
		// While it waits it keeps the walsender's timeout away, and the source's silence (no
		// keepalive answers here) does not count.
		wantStatuses(t, r, r.srv.sent(), map[time.Duration]bool{0: false, 10 * time.Second: false, 20 * time.Second: false, 30 * time.Second: false})
		for range 3 {
			sink.gate <- struct{}{}
			synctest.Wait()
		}
		checkCalls(t, sink.applied(), []applyCall{{end: txnEnd(c1), rows: map[pglogrepl.LSN]int{c1: 1}},
			{end: txnEnd(c3), rows: map[pglogrepl.LSN]int{c2: 3, c3: 3}}, // over the limit, not split
			{end: txnEnd(c4), rows: map[pglogrepl.LSN]int{c4: 1}}})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		checkFlushBounds(t, r.srv.sent())
	})
}

func TestLoopOversizedTransactionInParts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &fakeSink{}
		r := startLoop(t, sink, func(c *StreamConfig) { c.MaxPendingBytes = 1 })
		c1 := loopStart + 0x100
		r.srv.send(txn(c1, 1, 3)...)
		synctest.Wait()
		// Each change is handed over on its own, with the progress LSN before the transaction;
		// its commit then moves the progress LSN with nothing left to write.
		checkCalls(t, sink.applied(), []applyCall{{end: loopStart, rows: map[pglogrepl.LSN]int{c1: 1}},
			{end: loopStart, rows: map[pglogrepl.LSN]int{c1: 1}}, {end: loopStart, rows: map[pglogrepl.LSN]int{c1: 1}},
			{end: txnEnd(c1), rows: map[pglogrepl.LSN]int{}}})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		checkFlushBounds(t, r.srv.sent())
	})
}

func TestLoopStatusIntervalWithoutTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := startLoop(t, &fakeSink{}, nil)
		r.srv.mu.Lock()
		r.srv.answer, r.srv.walEnd = true, loopStart
		r.srv.mu.Unlock()
		time.Sleep(45 * time.Second)
		// The first update reports Start; then one every interval asks for a keepalive.
		wantStatuses(t, r, r.srv.sent(), map[time.Duration]bool{0: false, 10 * time.Second: true, 20 * time.Second: true,
			30 * time.Second: true, 40 * time.Second: true})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLoopAnswersKeepaliveReplyRequested(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := startLoop(t, &fakeSink{}, nil)
		time.Sleep(3 * time.Second)
		r.srv.send(keepaliveMsg(loopStart, true))
		synctest.Wait()
		wantStatuses(t, r, r.srv.sent(), map[time.Duration]bool{0: false, 3 * time.Second: false})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLoopIdleKeepalivesAdvanceWatermark(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &fakeSink{}
		r := startLoop(t, sink, nil)
		at := func(d time.Duration) { time.Sleep(d - r.since(time.Now())); synctest.Wait() }
		at(500 * time.Millisecond)
		r.srv.send(keepaliveMsg(loopStart+0x100, false)) // recorded at once
		at(700 * time.Millisecond)
		r.srv.send(keepaliveMsg(loopStart+0x200, false)) // throttled: recorded 1 s after the last
		at(3 * time.Second)
		c := loopStart + 0x300
		r.srv.send(txnBegin(c, 1, 1)...)
		r.srv.send(keepaliveMsg(loopStart+0x400, false)) // inside a transaction: not recorded
		at(5 * time.Second)
		if st := r.s.Stats(); st.Flushed != loopStart+0x200 || st.ServerSent != loopStart+0x400 {
			t.Errorf("in a transaction: flushed %s server sent %s, want %s %s", st.Flushed, st.ServerSent, loopStart+0x200, loopStart+0x400)
		}
		r.srv.send(txnCommit(c))
		synctest.Wait()
		calls := sink.applied()
		want := []struct {
			at  time.Duration
			end pglogrepl.LSN
		}{{500 * time.Millisecond, loopStart + 0x100}, {1500 * time.Millisecond, loopStart + 0x200}, {5 * time.Second, txnEnd(c)}}
		for i, w := range want {
			if i >= len(calls) || r.since(calls[i].at) != w.at || calls[i].end != w.end {
				t.Errorf("apply call %d of %d: want end %s at %s", i, len(calls), w.end, w.at)
			} else if i < 2 && len(calls[i].rows) != 0 {
				t.Errorf("idle progress call %d wrote rows %v", i, calls[i].rows)
			}
		}
		sts := r.srv.sent()
		flushAt := map[time.Duration]pglogrepl.LSN{}
		for _, st := range sts {
			flushAt[r.since(st.at)] = st.WALFlushPosition
		}
		if flushAt[500*time.Millisecond] != loopStart+0x100 || flushAt[1500*time.Millisecond] != loopStart+0x200 || flushAt[5*time.Second] != txnEnd(c) {
			t.Errorf("status flush positions by instant %v: each move is reported when recorded", flushAt)
		}
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		checkFlushBounds(t, r.srv.sent())
	})
}

func TestLoopSilentSourceEnds(t *testing.T) {
	for _, tc := range []struct {
		name        string
		keepaliveAt time.Duration // 0: none
		want        time.Duration
	}{
		{"nothing ever", 0, 40 * time.Second},                                    // > 3 intervals of waiting
		{"one keepalive restarts the count", 25 * time.Second, 60 * time.Second}, // 5+10+10+10 s after it
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := startLoop(t, &fakeSink{}, nil)
				if tc.keepaliveAt > 0 {
					time.Sleep(tc.keepaliveAt)
					r.srv.send(keepaliveMsg(loopStart, false))
				}
				err := <-r.done
				if !errors.Is(err, ErrSourceSilent) || r.since(time.Now()) != tc.want {
					t.Errorf("stream returned %v at %s, want ErrSourceSilent at %s", err, r.since(time.Now()), tc.want)
				}
				for _, st := range r.srv.sent() {
					if at := r.since(st.at); at > 0 && (!st.ReplyRequested || at%(10*time.Second) != 0) {
						t.Errorf("status at %s (reply %v): want only keepalive requests every interval", at, st.ReplyRequested)
					}
				}
			})
		})
	}
}

func TestLoopWaitForTheTargetIsNotSilence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &fakeSink{gate: make(chan struct{})}
		r := startLoop(t, sink, func(c *StreamConfig) { c.GroupRows, c.HeadGroupRows = 1, 1 })
		r.srv.send(txn(loopStart+0x100, 1, 1)...)
		r.srv.send(txn(loopStart+0x200, 2, 1)...) // waits for the first group's apply
		time.Sleep(35 * time.Second)
		sink.gate <- struct{}{}
		sink.gate <- struct{}{}
		// The source stays silent from here (and answered no status update before): the 35 s
		// the loop waited for the target do not count, so silence ends the stream after more
		// than three intervals of receiving, at the fourth status interval after 35 s (the
		// second commit's position went out at 35 s, so the next update is due at 45 s).
		err := <-r.done
		if want := 75 * time.Second; !errors.Is(err, ErrSourceSilent) || r.since(time.Now()) != want {
			t.Errorf("stream returned %v at %s, want ErrSourceSilent at %s", err, r.since(time.Now()), want)
		}
		checkFlushBounds(t, r.srv.sent())
	})
}

func TestLoopEndsOnServerOrTargetError(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  pgproto3.BackendMessage
		sink error
		want func(error) bool
	}{
		{"publication dropped", &pgproto3.ErrorResponse{Severity: "ERROR", Code: "42704", Message: "publication does not exist"}, nil,
			func(err error) bool { return errors.Is(err, ErrPublicationMissing) }},
		{"other server error", &pgproto3.ErrorResponse{Severity: "ERROR", Code: "XX000", Message: "boom"}, nil,
			func(err error) bool {
				return err != nil && strings.Contains(err.Error(), "boom") && !errors.Is(err, ErrPublicationMissing)
			}},
		{"copy done", &pgproto3.CopyDone{}, nil, func(err error) bool { return err != nil && strings.Contains(err.Error(), "CopyDone") }},
		{"empty copy data", &pgproto3.CopyData{}, nil, func(err error) bool { return err != nil }},
		{"target error", nil, errTarget, func(err error) bool { return errors.Is(err, errTarget) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sink := &fakeSink{err: tc.sink}
				r := startLoop(t, sink, nil)
				if tc.msg != nil {
					r.srv.send(tc.msg)
				} else {
					r.srv.send(txn(loopStart+0x100, 1, 1)...)
				}
				if err := <-r.done; !tc.want(err) || r.since(time.Now()) != 0 {
					t.Errorf("stream returned %v at %s", err, r.since(time.Now()))
				}
				checkFlushBounds(t, r.srv.sent())
				for _, st := range r.srv.sent() {
					if st.WALFlushPosition != loopStart {
						t.Errorf("flush %s reported, want %s: nothing was committed", st.WALFlushPosition, loopStart)
					}
				}
			})
		})
	}
}

var errTarget = errors.New("target refused")
