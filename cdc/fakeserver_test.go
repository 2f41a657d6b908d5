package cdc

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// The receive loop's tests run Streamer.stream against fakeServer, a walsender in memory, and
// fakeSink, a target in memory, inside a synctest bubble: time is fake, so deadlines and status
// intervals happen at exact instants and nothing sleeps for real.

// loopStart is where the tests' streams start.
const loopStart = pglogrepl.LSN(0x1000000)

// sentStatus is one standby status update the loop sent, with what the sink had committed and
// what ConfirmLimit allowed at that moment.
type sentStatus struct {
	pglogrepl.StandbyStatusUpdate
	at        time.Time
	committed pglogrepl.LSN // the sink's committed position when it was sent
	limit     pglogrepl.LSN // ConfirmLimit() when it was sent, or the maximum LSN without one
}

// fakeServer is a replicationConn that plays the walsender: the test queues messages, the loop
// receives them in order under its read deadline, and every status update is recorded.
type fakeServer struct {
	sink  *fakeSink
	limit func() pglogrepl.LSN // the stream's ConfirmLimit, nil without one
	kick  chan struct{}        // wakes a waiting ReceiveMessage: a message or a new deadline

	mu       sync.Mutex
	queue    []pgproto3.BackendMessage
	deadline time.Time
	statuses []sentStatus
	// answer, when set, answers each status update that asks for a reply with a keepalive at
	// walEnd, as a live walsender does.
	answer bool
	walEnd pglogrepl.LSN
}

func newFakeServer(sink *fakeSink) *fakeServer {
	return &fakeServer{sink: sink, kick: make(chan struct{}, 1)}
}

func (f *fakeServer) wakeReceiver() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

func (f *fakeServer) ReceiveMessage(ctx context.Context) (pgproto3.BackendMessage, error) {
	for {
		f.mu.Lock()
		if len(f.queue) > 0 {
			m := f.queue[0]
			f.queue = f.queue[1:]
			f.mu.Unlock()
			return m, nil
		}
		d := f.deadline
		f.mu.Unlock()
		var expired <-chan time.Time
		if !d.IsZero() {
			if !time.Now().Before(d) {
				return nil, os.ErrDeadlineExceeded
			}
			timer := time.NewTimer(time.Until(d))
			defer timer.Stop()
			expired = timer.C
		}
		select {
		case <-f.kick:
		case <-expired:
			return nil, os.ErrDeadlineExceeded
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (f *fakeServer) SendStandbyStatusUpdate(_ context.Context, u pglogrepl.StandbyStatusUpdate) error {
	st := sentStatus{StandbyStatusUpdate: u, at: time.Now(), committed: f.sink.committedLSN(), limit: ^pglogrepl.LSN(0)}
	if f.limit != nil {
		st.limit = max(f.limit(), loopStart)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statuses = append(f.statuses, st)
	if f.answer && u.ReplyRequested {
		f.queue = append(f.queue, keepaliveMsg(f.walEnd, false))
		f.wakeReceiver()
	}
	return nil
}

func (f *fakeServer) SetReadDeadline(t time.Time) error {
	f.mu.Lock()
	f.deadline = t
	f.mu.Unlock()
	f.wakeReceiver()
	return nil
}

// send queues messages for the loop.
func (f *fakeServer) send(msgs ...pgproto3.BackendMessage) {
	f.mu.Lock()
	f.queue = append(f.queue, msgs...)
	f.mu.Unlock()
	f.wakeReceiver()
}

// sent returns the status updates sent so far.
func (f *fakeServer) sent() []sentStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sentStatus(nil), f.statuses...)
}

// keepaliveMsg encodes a primary keepalive message.
func keepaliveMsg(walEnd pglogrepl.LSN, reply bool) *pgproto3.CopyData {
	r := byte(0)
	if reply {
		r = 1
	}
	return &pgproto3.CopyData{Data: enc{pglogrepl.PrimaryKeepaliveMessageByteID}.u64(uint64(walEnd)).u64(0).u8(r)}
}

// xlogMsg wraps a pgoutput message in XLogData starting at walStart.
func xlogMsg(walStart pglogrepl.LSN, pgoutput []byte) *pgproto3.CopyData {
	return &pgproto3.CopyData{Data: append(enc{pglogrepl.XLogDataByteID}.u64(uint64(walStart)).u64(uint64(walStart)).u64(0), pgoutput...)}
}

// txnEnd is the end LSN of the test transaction committed at commit.
func txnEnd(commit pglogrepl.LSN) pglogrepl.LSN { return commit + 0x10 }

// txnBegin returns the messages that open a transaction committed at commit and insert n rows of
// table items into it (ids id0, id0+1, …).
func txnBegin(commit pglogrepl.LSN, id0, n int) []pgproto3.BackendMessage {
	msgs := []pgproto3.BackendMessage{xlogMsg(commit, msgBegin(commit, uint32(commit))), xlogMsg(commit, itemsRel)}
	for i := range n {
		msgs = append(msgs, xlogMsg(commit, msgInsert(16400, strconv.Itoa(id0+i), "x", "1")))
	}
	return msgs
}

// txnCommit returns the message that commits the transaction committed at commit.
func txnCommit(commit pglogrepl.LSN) pgproto3.BackendMessage {
	return xlogMsg(txnEnd(commit), msgCommit(commit, txnEnd(commit)))
}

// txn returns the messages of a whole transaction committed at commit that inserts n rows.
func txn(commit pglogrepl.LSN, id0, n int) []pgproto3.BackendMessage {
	return append(txnBegin(commit, id0, n), txnCommit(commit))
}

// applyCall is what the sink saw of one ApplyFunc call.
type applyCall struct {
	at  time.Time
	end pglogrepl.LSN
	// rows counts the changes by the commit LSN of their transaction (their version's LSN).
	rows map[pglogrepl.LSN]int
}

// fakeSink is an ApplyFunc that commits at once, or, while gated, only when the test lets it.
type fakeSink struct {
	gate chan struct{} // when not nil, each call waits for a value from it

	mu        sync.Mutex
	committed pglogrepl.LSN
	calls     []applyCall
	err       error
}

func (k *fakeSink) apply(ctx context.Context, batches []arrow.RecordBatch, end pglogrepl.LSN) error {
	c := applyCall{at: time.Now(), end: end, rows: map[pglogrepl.LSN]int{}}
	for _, rec := range batches {
		v, err := changebatch.NewView(rec)
		if err != nil {
			return err
		}
		for i := range v.Len() {
			c.rows[v.Version(i).LSN]++
		}
	}
	if k.gate != nil {
		select {
		case <-k.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return k.err
	}
	k.calls = append(k.calls, c)
	k.committed = max(k.committed, end)
	return nil
}

func (k *fakeSink) committedLSN() pglogrepl.LSN {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.committed
}

// applied returns the calls that committed so far.
func (k *fakeSink) applied() []applyCall {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]applyCall(nil), k.calls...)
}

// loopRun is a Streamer's loop running against a fake server and sink.
type loopRun struct {
	srv    *fakeServer
	sink   *fakeSink
	s      *Streamer
	start  time.Time
	cancel context.CancelFunc
	done   chan error
}

// startLoop starts a stream at loopStart over table items with a 10 s status interval, after
// cfg's changes; it must run in a synctest bubble. The test ends it with stop.
func startLoop(t *testing.T, sink *fakeSink, cfg func(*StreamConfig)) *loopRun {
	t.Helper()
	c := StreamConfig{Slot: "s", Publication: "p", Start: loopStart, Tables: []changebatch.Table{items},
		Apply: sink.apply, StatusInterval: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)}
	if cfg != nil {
		cfg(&c)
	}
	s, err := NewStreamer(c)
	if err != nil {
		t.Fatal(err)
	}
	srv := newFakeServer(sink)
	srv.limit = c.ConfirmLimit
	ctx, cancel := context.WithCancel(t.Context())
	r := &loopRun{srv: srv, sink: sink, s: s, start: time.Now(), cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.stream(ctx, srv, false) }()
	return r
}

// since returns how long after the loop's start t is.
func (r *loopRun) since(t time.Time) time.Duration { return t.Sub(r.start) }

// stop ends the loop's context and returns what stream returned.
func (r *loopRun) stop() error {
	r.cancel()
	return <-r.done
}

// checkFlushBounds fails the test for any status update whose flush position exceeds what the
// sink had committed or what ConfirmLimit allowed when it was sent, or whose write position is
// below its flush position.
func checkFlushBounds(t *testing.T, sts []sentStatus) {
	t.Helper()
	for i, st := range sts {
		if st.WALFlushPosition > max(st.committed, loopStart) || st.WALFlushPosition > st.limit {
			t.Errorf("status %d: flush %s exceeds committed %s or confirm limit %s", i, st.WALFlushPosition, st.committed, st.limit)
		}
		if st.WALApplyPosition != st.WALFlushPosition || st.WALWritePosition < st.WALFlushPosition {
			t.Errorf("status %d: write %s apply %s flush %s", i, st.WALWritePosition, st.WALApplyPosition, st.WALFlushPosition)
		}
	}
}
