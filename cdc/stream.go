package cdc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/disposition"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// ApplyFunc writes batches to the target and records end as the position up to which the target
// holds every change, all in one target transaction, and returns only after it committed. end is
// the end LSN of the last whole source transaction in the batches; batches may be empty (an idle
// source moved on). The batches belong to the caller of ApplyFunc, who releases them after it
// returns.
type ApplyFunc func(ctx context.Context, batches []arrow.RecordBatch, end pglogrepl.LSN) error

// ApplyStreamedFunc merges the rows streamed transaction xid staged (Stager.StageRows) at versions
// (commit, ordinal) and records end as the position up to which the target holds every change,
// all in one target transaction, and returns only after it committed.
type ApplyStreamedFunc func(ctx context.Context, xid uint32, commit, end pglogrepl.LSN) error

// ErrSourceSilent ends Run when the source sent nothing, not even the keepalive every status
// update asks for, for three status intervals of waiting: the connection is dead though no error
// says so (a network that drops packets without resetting the connection, a hung server or
// proxy), and a new session reconnects (the daemon backs off). Time spent waiting for the target
// does not count.
var ErrSourceSilent = disposition.New("the source went silent", disposition.Mark{
	Action: disposition.BackOff,
	Hint:   "the replication connection went silent without an error (a network dropping packets, a hung server or proxy): the daemon reconnects; check the network between this host and the source",
})

// Knobs are fault-injection hooks for tests; nil hooks do nothing.
type Knobs struct {
	// OnMessage runs before each decoded pgoutput message is handled.
	OnMessage func(m pglogrepl.Message)
	// AfterApply runs after ApplyFunc returned (the target committed end) and before the flush
	// position is reported to the source.
	AfterApply func(end pglogrepl.LSN)
	// OnGroup runs in the apply goroutine before ApplyFunc, with the group's changes and whether
	// the stream was at the head when the group was formed (StreamConfig.HeadGroupRows).
	OnGroup func(changes int, head bool)
	// AfterStage runs after messages or rows of a streamed transaction were written to the Stager.
	AfterStage func()
}

// StreamConfig configures a Streamer.
type StreamConfig struct {
	Slot        string
	Publication string
	// Start is the position up to which the target holds every change; streaming resumes there.
	Start pglogrepl.LSN
	// Tables are the replicated tables; changes of other published tables are skipped.
	Tables []changebatch.Table
	// DescribedAt is a source position (CurrentLSN) read before Tables were described. A Relation
	// message of a transaction committed at or after it that differs from its table's description
	// ends Run with a *SchemaChangeError before anything of that transaction is applied; 0 treats
	// every difference so.
	DescribedAt pglogrepl.LSN
	// ReloadFences maps a table's source oid to a position below which a backfill read later is
	// due for it (the ledger's schema_changed_lsn): a transaction below it that the stream cannot
	// write in full is left to that backfill. Optional.
	ReloadFences map[uint32]pglogrepl.LSN
	Apply        ApplyFunc
	// GroupRows bounds a group of whole transactions (one target commit): while the target applies
	// one group, the next grows until it holds this many changes, and then waits (default 10,000).
	// A group is handed to the target as soon as the target is free, so near the head of the
	// stream groups are small and while catching up they are large. This bound holds while the
	// stream is behind (from its start, or once its lag exceeded 16 MiB, until it caught up).
	GroupRows int
	// HeadGroupRows bounds a group instead of GroupRows while the stream is at the head (default
	// 1,000 changes). A walsender sends WAL as the source flushes it, so a burst of a flush's
	// transactions arrives at once (with synchronous_commit off, every wal_writer_delay); applied
	// as one group, the target's position would only move when all of it committed, and applied
	// in groups of this size it moves as each commits, at a small cost per commit.
	HeadGroupRows int
	// MaxPendingBytes bounds the memory held for one group (default 64 MiB); at most two groups
	// are held, the one being applied and the next. A transaction larger than that is applied in
	// parts, and the progress LSN stays before it until its commit.
	MaxPendingBytes int
	// SourceWALEnd returns the source's current WAL position as last sampled (CurrentLSN);
	// it measures lag for logs. Optional: without it, lag is measured against the walsender's
	// sent position, which understates it while the stream is behind.
	SourceWALEnd func() pglogrepl.LSN
	// CheckStart, when set, runs once START_REPLICATION holds the slot and before anything is
	// received: no one else can move the slot then, so it can check that the server streams from
	// Start and not from a later position (PostgreSQL silently forwards a start position below
	// the slot's confirmed_flush_lsn). An error ends Run.
	CheckStart func(ctx context.Context) error
	// StartBound, when set, returns the context START_REPLICATION waits for its answer under
	// (a deadline, so that a frozen network fails the start instead of holding it), and the func
	// to call once it answered; the receive loop is not bounded by it.
	StartBound func(ctx context.Context) (context.Context, func())
	// ConfirmLimit, when set, bounds the flush position reported to the source (the slot's
	// confirmed_flush_lsn) by a position the caller vouches for, such as one read before its last
	// successful catalog check: a change without row events (ATTACH PARTITION, ADD COLUMN …
	// DEFAULT, a publication change) that the target does not reflect yet is then never
	// confirmed. A limit below Start counts as Start. The target's progress is not bounded: a
	// session start checks the catalog again before it streams from there.
	// Paused, when set, is asked before each read from the slot: while it returns true the
	// stream reads nothing more (the walsender waits, the slot holds WAL), applies and confirms
	// what it received, and keeps sending status updates (pgconverge pause).
	Paused       func() bool
	ConfirmLimit func() pglogrepl.LSN
	// Stager, when set, turns on the streaming of in-progress transactions on a source of
	// PostgreSQL 14 or later (streamed.go): pgoutput protocol version 2 (4 from PostgreSQL 16),
	// option streaming 'on'; the messages of a transaction streamed before its commit are staged
	// there and applied at its commit. Nil, or an older source: protocol 1, and the source holds
	// every transaction until its commit (spilling past logical_decoding_work_mem to its disk).
	Stager Stager
	// ApplyStreamed, when set with Stager, lets a streamed transaction be staged as rows while it
	// runs and merged set-based at its commit (streamedrows.go); nil: its messages are decoded at
	// its commit.
	ApplyStreamed ApplyStreamedFunc
	// StatusInterval is the period of standby status updates and progress log lines (default 10 s).
	StatusInterval time.Duration
	Logger         *slog.Logger
	Knobs          Knobs
}

// Validate reports every problem of the configuration at once.
func (c *StreamConfig) Validate() error {
	var errs []error
	if err := ValidateSlotName(c.Slot); err != nil {
		errs = append(errs, err)
	}
	if err := ValidatePublicationName(c.Publication); err != nil {
		errs = append(errs, err)
	}
	if c.Start == 0 {
		errs = append(errs, errors.New("stream start LSN is 0/0"))
	}
	if c.Apply == nil {
		errs = append(errs, errors.New("stream has no ApplyFunc"))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("stream has no logger"))
	}
	return errors.Join(errs...)
}

func (c *StreamConfig) defaults() {
	if c.GroupRows <= 0 {
		c.GroupRows = 10_000
	}
	if c.HeadGroupRows <= 0 {
		c.HeadGroupRows = 1_000
	}
	if c.MaxPendingBytes <= 0 {
		c.MaxPendingBytes = 64 << 20
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = 10 * time.Second
	}
}

// Stats is a snapshot of a Streamer's positions (LSNs) and counters.
type Stats struct {
	// Received is the end of the last WAL data received.
	Received pglogrepl.LSN
	// Flushed is the position up to which the target committed every change; Confirmed the
	// position last reported to the source as flushed (at most Flushed, and at most the
	// ConfirmLimit).
	Flushed, Confirmed pglogrepl.LSN
	// ServerSent is the position up to which the walsender decoded and sent, from its keepalives.
	ServerSent pglogrepl.LSN
	// SourceWALEnd is the source's WAL position (CurrentLSN) as last sampled through
	// StreamConfig.SourceWALEnd, or 0 without a sampler.
	SourceWALEnd pglogrepl.LSN
	// Transactions and Changes count whole transactions and row changes received.
	Transactions, Changes int64
	// StreamedOpen is how many transactions the source is streaming before their commit now,
	// StagedBytes the bytes of the pgoutput messages they sent, staged on the target (as rows or
	// messages), StreamedCommitted how many streamed transactions committed and were applied
	// (StreamConfig.Stager).
	StreamedOpen, StagedBytes, StreamedCommitted int64
}

// Streamer streams one slot into an ApplyFunc. Create it with NewStreamer; Stats may be read from
// any goroutine while Run runs.
type Streamer struct {
	cfg                                     StreamConfig
	received, flushed, serverEnd, confirmed atomic.Uint64
	transactions, changes                   atomic.Int64
	streamedOpen, stagedBytes               atomic.Int64
	streamedCommitted                       atomic.Int64
}

func (s *Streamer) sourceWALEnd() pglogrepl.LSN {
	if s.cfg.SourceWALEnd == nil {
		return 0
	}
	return s.cfg.SourceWALEnd()
}

// Lag returns how many bytes of WAL the target is behind: the latest known source position (the
// sampled WAL end, the walsender's sent position or the end of the WAL data received, whichever is
// highest, as each may be a moment old) minus the flushed position; never negative.
func (st Stats) Lag() int64 {
	end := max(st.SourceWALEnd, st.ServerSent, st.Received)
	if end <= st.Flushed {
		return 0
	}
	return int64(end - st.Flushed)
}

// NewStreamer validates cfg and returns a Streamer.
func NewStreamer(cfg StreamConfig) (*Streamer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	s := &Streamer{cfg: cfg}
	s.flushed.Store(uint64(cfg.Start))
	s.received.Store(uint64(cfg.Start))
	return s, nil
}

// Stats returns the current positions and counters.
func (s *Streamer) Stats() Stats {
	return Stats{
		Received: pglogrepl.LSN(s.received.Load()), Flushed: pglogrepl.LSN(s.flushed.Load()),
		Confirmed: pglogrepl.LSN(s.confirmed.Load()), ServerSent: pglogrepl.LSN(s.serverEnd.Load()), SourceWALEnd: s.sourceWALEnd(),
		Transactions: s.transactions.Load(), Changes: s.changes.Load(),
		StreamedOpen: s.streamedOpen.Load(), StagedBytes: s.stagedBytes.Load(), StreamedCommitted: s.streamedCommitted.Load(),
	}
}

// confirmable returns the flush position to report: what the target committed, bounded by
// ConfirmLimit (never below Start).
func (s *Streamer) confirmable() pglogrepl.LSN {
	f := pglogrepl.LSN(s.flushed.Load())
	if s.cfg.ConfirmLimit != nil {
		f = min(f, max(s.cfg.ConfirmLimit(), s.cfg.Start))
	}
	return f
}

// Run starts replication on conn (a replication connection that Run then owns until it returns)
// and applies transactions until ctx ends or an error occurs. On ctx's end it lets an apply in
// progress finish, reports the final flush position and returns nil. Errors from the source, the
// target or decoding are returned wrapped; the caller reconnects.
func (s *Streamer) Run(ctx context.Context, conn *pgconn.PgConn) error {
	cfg := s.cfg
	sctx, answered := ctx, func() {}
	if cfg.StartBound != nil {
		sctx, answered = cfg.StartBound(ctx)
	}
	streams := cfg.Stager != nil && pgsession.MajorVersion(conn) >= MinStreamingVersion
	err := pglogrepl.StartReplication(sctx, conn, cfg.Slot, cfg.Start, pglogrepl.StartReplicationOptions{
		PluginArgs: pluginArgs(cfg.Publication, pgsession.MajorVersion(conn), streams),
	})
	answered()
	if err != nil {
		if pgsession.IsCode(err, pgerrcode.UndefinedObject) {
			// The one object START_REPLICATION names that can be missing is the slot.
			return fmt.Errorf("start replication on slot %q at %s: %w: %w", cfg.Slot, cfg.Start, ErrSlotMissing, err)
		}
		return fmt.Errorf("start replication on slot %q at %s: %w", cfg.Slot, cfg.Start, err)
	}
	if cfg.CheckStart != nil {
		if err := cfg.CheckStart(ctx); err != nil {
			return err
		}
	}
	if streams {
		if err := cfg.Stager.Clear(ctx); err != nil {
			return fmt.Errorf("discard the staging of slot %q's earlier sessions: %w", cfg.Slot, err)
		}
	}
	return s.stream(ctx, pgReplicationConn{conn}, streams)
}

// MinStreamingVersion is the first major version of PostgreSQL whose pgoutput streams
// in-progress transactions (protocol version 2).
const MinStreamingVersion = 14

// pluginArgs are pgoutput's options for publication on a server of major version v: protocol
// version 1, or with streams the streaming of in-progress transactions, in protocol version 2 (4
// from PostgreSQL 16, the version that may stream for parallel apply; with streaming 'on' its
// messages are those of 2).
func pluginArgs(publication string, v int, streams bool) []string {
	args := []string{"proto_version '1'", "publication_names '" + publication + "'"}
	if streams {
		args[0] = "proto_version '2'"
		if v >= 16 {
			args[0] = "proto_version '4'"
		}
		args = append(args, "streaming 'on'")
	}
	return args
}

// stream runs the receive loop on conn, a connection START_REPLICATION put in streaming mode, and
// finishes as Run documents.
func (s *Streamer) stream(ctx context.Context, conn replicationConn, streams bool) error {
	cfg := s.cfg
	cfg.Logger.Info("streaming", "slot", cfg.Slot, "publication", cfg.Publication, "lsn", cfg.Start.String(), "in_progress_transactions", streams)
	l := &loop{s: s, conn: conn, asm: newAssembler(memory.DefaultAllocator, cfg.Tables, cfg.DescribedAt, cfg.ReloadFences)}
	if streams {
		l.streaming = &streaming{stager: cfg.Stager, open: map[uint32]*openTxn{}}
	}
	defer l.asm.release()
	// An apply that started finishes even when ctx ends, within a grace period.
	applyCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(30*time.Second, cancel) })
	defer stop()
	wakeOnEnd := context.AfterFunc(ctx, l.wake)
	err := l.run(ctx, applyCtx)
	wakeOnEnd()
	final, cancelFinal := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancelFinal()
	derr := l.drainApply(final)
	_ = conn.SetReadDeadline(time.Time{})
	if ctx.Err() == nil {
		return cmp.Or(err, derr)
	}
	if derr != nil {
		return derr
	}
	if serr := l.sendStatus(final, false); serr != nil {
		cfg.Logger.Warn("final standby status update", "err", serr)
	}
	cfg.Logger.Info("stream stopped", "slot", cfg.Slot, "flushed_lsn", s.Stats().Flushed.String())
	return nil
}

// receiveDeadline is the time until which loop.run waits for the next message.
func (l *loop) receiveDeadline() time.Time {
	d := l.nextStatus
	if l.s.flushed.Load() > l.s.confirmed.Load() && l.lastConfirmCheck.Add(confirmEvery).Before(d) {
		d = l.lastConfirmCheck.Add(confirmEvery) // see whether the confirm limit moved
	}
	if l.idleEnd > pglogrepl.LSN(l.s.flushed.Load()) && l.idle() && l.lastIdleProgress.Add(idleProgressEvery).Before(d) {
		// Record a throttled keepalive's WAL end when the throttle ends (the run loop did so at its
		// top if it had ended). Not while a group is held: the group's flush comes first.
		d = l.lastIdleProgress.Add(idleProgressEvery)
	}
	return d
}
