package cdc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pglogrepl"
)

// Streaming of in-progress transactions (pgoutput option streaming 'on', protocol version 2 and
// later, PostgreSQL 14 and later; PostgreSQL docs §55.5 "Logical Streaming Replication
// Protocol", §55.9 "Logical Replication Message Formats"): once a transaction's changes pass the
// source's logical_decoding_work_mem, the walsender sends them in blocks (Stream Start … Stream
// Stop) before the transaction ends, each change tagged with its (sub)transaction's xid, and ends
// the transaction with Stream Commit or Stream Abort (of the transaction, or of one
// subtransaction). The source spills nothing to disk for it.
//
// The loop stages every message of a block on the target (Stager), never only in memory, and
// applies nothing of it before its Stream Commit: then it reads the staged messages back in order
// and hands them to the assembler as one transaction at the commit's LSN (Begin … Commit), as if
// the transaction had arrived whole, so the version rule, the progress and the parts a large
// transaction is applied in are those of any transaction. A Stream Abort discards what the
// transaction, or the subtransaction, staged. A new session discards all staging of its slot: the
// walsender streams every transaction not confirmed again from its start, since the slot's
// restart_lsn is held at the oldest transaction still running.

// Stager keeps the messages of streamed transactions, in the order received, until their commit
// or abort (apply.Staging keeps them in a table of the target). Messages are in protocol version
// 1 form: the xid that tags a message within a stream block is taken out (StagedMessage.SubXid).
type Stager interface {
	// Clear discards everything staged for the slot (at the start of a session).
	Clear(ctx context.Context) error
	// Stage appends msgs, in order; their Seq is increasing per Xid.
	Stage(ctx context.Context, msgs []StagedMessage) error
	// DiscardSub discards the row changes (not the Relation and Type messages) that
	// subtransaction subXid of transaction xid staged.
	DiscardSub(ctx context.Context, xid, subXid uint32) error
	// Discard discards everything transaction xid staged.
	Discard(ctx context.Context, xid uint32) error
	// Read returns up to limit messages of transaction xid with Seq above after, in Seq order.
	Read(ctx context.Context, xid uint32, after int64, limit int) ([]StagedMessage, error)
	// StageRows appends rec, changes of one table made by subtransaction subXid of transaction
	// xid, decoded ahead of the commit, at versions with a placeholder LSN (streamedrows.go);
	// inserts is true when every change of rec is an INSERT, and so was every change of xid
	// before. DiscardSub and Discard discard them as they do messages.
	StageRows(ctx context.Context, xid, subXid uint32, rec arrow.RecordBatch, inserts bool) error
	// Flush returns once every row StageRows was given is written (StageRows may return before).
	Flush(ctx context.Context) error
}

// StagedMessage is one pgoutput message of a streamed transaction.
type StagedMessage struct {
	// Xid is the top-level transaction's (Stream Start), SubXid the xid that tagged the message:
	// the transaction's own or one of its subtransactions'.
	Xid, SubXid uint32
	// Seq orders the messages of Xid, from 1.
	Seq int64
	// Data is the message in protocol version 1 form: its type byte, then its body.
	Data []byte
}

// stageBatchBytes is how many bytes of staged messages the loop holds before it writes them to
// the Stager; a block's end (Stream Stop) and a commit or abort write them too.
const stageBatchBytes = 4 << 20

// replayPage is how many staged messages the loop reads back and hands to the assembler per turn
// of its loop, between which it sends status updates and applies what is held.
const replayPage = 2000

// streaming is the loop's state of streamed transactions.
type streaming struct {
	stager Stager
	// inBlock is true between Stream Start and Stream Stop, for transaction xid.
	inBlock bool
	xid     uint32
	// open are the transactions streamed and neither committed nor aborted yet, by xid.
	open map[uint32]*openTxn
	buf  []StagedMessage
	held int
	// replay is the committed transaction being read back, nil when none is.
	replay *replaying
	// rowsCommit is the committed transaction whose staged rows are to be merged, nil when none
	// is (streamedrows.go).
	rowsCommit *rowsCommit
}

// openTxn is what an open streamed transaction staged: its last Seq and its bytes; and its rows
// decoded ahead of the commit (streamedrows.go).
type openTxn struct {
	seq, bytes int64
	// rows assembles the transaction's changes as they arrive, nil before the first or once it
	// takes the general path.
	rows *assembler
	// sub is the subtransaction of the changes rows holds; changed is set once the transaction
	// updated or deleted a row.
	sub     uint32
	changed bool
	// general, when set, is why the transaction's changes from some point on are applied from
	// their messages at its commit; ordinals 1..typed are those of the changes before it, staged
	// as rows.
	general string
	typed   uint64
}

// replaying is a streamed transaction read back after its Stream Commit, up to Seq after.
type replaying struct {
	commit *pglogrepl.StreamCommitMessageV2
	after  int64
	began  time.Time
}

// streamMessage handles raw, a message received while streaming of in-progress transactions is
// on: a stream control message, or a message within a block, which is staged. It returns false
// for a message outside any block, which the caller decodes as usual.
func (l *loop) streamMessage(ctx context.Context, raw []byte) (bool, error) {
	st := l.streaming
	if st == nil || len(raw) == 0 {
		return false, nil
	}
	switch pglogrepl.MessageType(raw[0]) {
	case pglogrepl.MessageTypeStreamStart:
		var m pglogrepl.StreamStartMessageV2
		if err := decodeV2(&m, raw); err != nil {
			return true, err
		}
		if st.inBlock {
			return true, fmt.Errorf("pgoutput: Stream Start of transaction %d inside the block of transaction %d", m.Xid, st.xid)
		}
		if l.asm.inTxn {
			return true, fmt.Errorf("pgoutput: Stream Start of transaction %d inside transaction at %s", m.Xid, l.asm.finalLSN)
		}
		if st.open[m.Xid] == nil {
			st.open[m.Xid] = &openTxn{}
			l.s.streamedOpen.Add(1)
		}
		st.inBlock, st.xid = true, m.Xid
		return true, nil
	case pglogrepl.MessageTypeStreamStop:
		if !st.inBlock {
			return true, errors.New("pgoutput: Stream Stop outside a stream block")
		}
		st.inBlock = false
		if err := l.flushRows(ctx, st.xid, st.open[st.xid]); err != nil {
			return true, err
		}
		return true, l.flushStaged(ctx)
	case pglogrepl.MessageTypeStreamCommit:
		var m pglogrepl.StreamCommitMessageV2
		if err := decodeV2(&m, raw); err != nil {
			return true, err
		}
		if st.inBlock {
			return true, fmt.Errorf("pgoutput: Stream Commit of transaction %d inside a stream block", m.Xid)
		}
		if st.open[m.Xid] == nil {
			return true, fmt.Errorf("pgoutput: Stream Commit of transaction %d, which streamed nothing", m.Xid)
		}
		if err := l.flushStaged(ctx); err != nil {
			return true, err
		}
		t := st.open[m.Xid]
		if t.rows != nil {
			if err := l.flushRows(ctx, m.Xid, t); err != nil {
				return true, err
			}
			l.asm.changes += t.rows.changes
			l.s.changes.Store(l.asm.changes)
			t.typed = t.rows.seq
			t.releaseRows()
		}
		if err := st.stager.Flush(ctx); err != nil {
			return true, fmt.Errorf("stage rows of streamed transaction %d on the target: %w", m.Xid, err)
		}
		rc := &rowsCommit{commit: &m, began: time.Now()}
		if t.general != "" || l.s.cfg.ApplyStreamed == nil {
			rc.then = &replaying{commit: &m, began: rc.began}
			if t.typed == 0 {
				return true, l.beginReplay(rc)
			}
		}
		st.rowsCommit = rc
		return true, nil
	case pglogrepl.MessageTypeStreamAbort:
		var m pglogrepl.StreamAbortMessageV2
		if err := decodeV2(&m, raw); err != nil {
			return true, err
		}
		if err := l.flushStaged(ctx); err != nil {
			return true, err
		}
		if st.open[m.Xid] == nil {
			return true, nil // nothing of it was staged
		}
		if m.SubXid != m.Xid {
			// Its rows held in memory are staged first, for the discard to take them too.
			if err := l.flushRows(ctx, m.Xid, st.open[m.Xid]); err != nil {
				return true, err
			}
			return true, st.stager.DiscardSub(ctx, m.Xid, m.SubXid)
		}
		l.closeStreamed(m.Xid)
		return true, st.stager.Discard(ctx, m.Xid)
	}
	if !st.inBlock {
		return false, nil
	}
	if len(raw) < 5 {
		return true, errShort
	}
	t := st.open[st.xid]
	t.seq++
	data := make([]byte, 0, len(raw)-4)
	data = append(append(data, raw[0]), raw[5:]...)
	sub := binary.BigEndian.Uint32(raw[1:5])
	t.bytes += int64(len(data))
	l.s.stagedBytes.Add(int64(len(data)))
	if rows, err := l.stageRows(ctx, st.xid, sub, t, data); err != nil || rows && data[0] != 'R' && data[0] != 'Y' {
		// A change staged as a row is not staged as a message too; Relation and Type messages
		// are, for the messages of a part that takes the general path.
		return true, err
	}
	st.buf = append(st.buf, StagedMessage{Xid: st.xid, SubXid: sub, Seq: t.seq, Data: data})
	st.held += len(data)
	if st.held >= stageBatchBytes {
		return true, l.flushStaged(ctx)
	}
	return true, nil
}

// decodeV2 parses raw, a stream control message, into m, turning a panic of the parser on a
// malformed message into an error.
func decodeV2(m pglogrepl.MessageDecoderV2, raw []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed pgoutput message %q: %v", raw[0], r)
		}
	}()
	if err := m.DecodeV2(raw[1:], false); err != nil {
		return fmt.Errorf("pgoutput message %q: %w", raw[0], err)
	}
	return nil
}

// flushStaged writes the staged messages held in memory to the Stager.
func (l *loop) flushStaged(ctx context.Context) error {
	st := l.streaming
	if len(st.buf) == 0 {
		return nil
	}
	if err := st.stager.Stage(ctx, st.buf); err != nil {
		return fmt.Errorf("stage streamed transaction changes on the target: %w", err)
	}
	st.buf, st.held = st.buf[:0], 0
	if k := l.s.cfg.Knobs.AfterStage; k != nil {
		k()
	}
	return nil
}

// closeStreamed forgets the open streamed transaction xid (committed or aborted).
func (l *loop) closeStreamed(xid uint32) {
	st := l.streaming
	l.s.stagedBytes.Add(-st.open[xid].bytes)
	st.open[xid].releaseRows()
	delete(st.open, xid)
	l.s.streamedOpen.Add(-1)
}

// replayStep hands the next page of the committed streamed transaction's staged messages to the
// assembler, and, after the last, its Commit; then the staging is discarded (a crash before the
// commit's apply is confirmed streams the transaction again).
func (l *loop) replayStep(ctx context.Context) error {
	st := l.streaming
	r := st.replay
	msgs, err := st.stager.Read(ctx, r.commit.Xid, r.after, replayPage)
	if err != nil {
		return fmt.Errorf("read the staged changes of streamed transaction %d back from the target: %w", r.commit.Xid, err)
	}
	for _, sm := range msgs {
		m, err := decode(sm.Data)
		if err != nil {
			return fmt.Errorf("decode staged pgoutput message %d of transaction %d: %w", sm.Seq, sm.Xid, err)
		}
		if k := l.s.cfg.Knobs.OnMessage; k != nil {
			k(m)
		}
		if _, err := l.asm.handle(m); err != nil {
			return err
		}
		r.after = sm.Seq
	}
	l.s.changes.Store(l.asm.changes)
	if len(msgs) == replayPage {
		return nil
	}
	if _, err := l.asm.handle(&pglogrepl.CommitMessage{CommitLSN: r.commit.CommitLSN, TransactionEndLSN: r.commit.TransactionEndLSN, CommitTime: r.commit.CommitTime}); err != nil {
		return err
	}
	l.s.transactions.Store(l.asm.committed)
	st.replay = nil
	staged := st.open[r.commit.Xid].bytes
	l.closeStreamed(r.commit.Xid)
	l.s.streamedCommitted.Add(1)
	l.s.cfg.Logger.Info("streamed transaction committed: its staged changes are applied at its commit", "slot", l.s.cfg.Slot,
		"xid", r.commit.Xid, "commit_lsn", r.commit.CommitLSN.String(), "messages", r.after, "staged_bytes", staged,
		"read_back_seconds", fmt.Sprintf("%.1f", time.Since(r.began).Seconds()))
	return st.stager.Discard(ctx, r.commit.Xid)
}
