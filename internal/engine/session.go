package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/disposition"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/reconcile"
)

// session is one connected attempt of the daemon: checks, preparation, loads, then streaming. Its
// start (run's steps up to the stream) fills the embedded sessionStart; the stream's members get
// a copy of it (stream) and never change it.
type session struct {
	sessionStart
	mon  Monitor
	src  *pgx.Conn
	tgt  *pgx.Conn
	repl *pgconn.PgConn
	ap   *apply.Applier
	// primary is a connection to the source's primary while the source is a standby and
	// Config.Primary is set (connectPrimary); nil otherwise.
	primary *pgx.Conn
	// lock holds the slot's leader lock for the session (lead); watching is closed when the
	// goroutine that watches lock has returned.
	lock     *pgx.Conn
	watching chan struct{}
	// deadline bounds each statement of the session's start, catalog checks and ledger
	// bookkeeping, which run under its contexts (bounded, statementTimeout).
	deadline *pgsession.Deadline
}

// sessionStart is what a session's start established, which its stream's members read: the
// configuration, the selected tables as described and published, and where the stream starts.
// The start's steps fill it in order; once the stream begins it is passed by value and nothing
// writes it again (its slices and maps included).
type sessionStart struct {
	cfg         Config
	names       []changebatch.TableName
	memberships map[changebatch.TableName]string // publication membership of each table at the start
	// epoch is the session's leader epoch (lead), which its stream and backfill transactions
	// check.
	epoch int64
	// tables are the streamed tables; snapshotOnly those no publication can carry
	// (changebatch.Table.SnapshotOnly), kept by backfills alone.
	tables       []changebatch.Table
	snapshotOnly []changebatch.Table
	// patterns are the --tables patterns (changebatch.TablePattern): the tables they match are
	// selected, and one that starts matching while streaming restarts the session.
	patterns []changebatch.TablePattern
	// waiting are the selected tables the session leaves to the running daemons of other slots
	// that follow them, one follower each (settleOverlap).
	waiting []coverage.Follower
	// joined are the streamed tables that were kept by snapshots only until this session.
	joined   map[changebatch.TableName]bool
	sourceID string // cdc.SourceID of the source
	// standby is true when the source is a standby in recovery at the session's start, which
	// decodes the WAL it replays (connectPrimary).
	standby  bool
	timeline int64 // the source server's timeline (checkTimeline)
	// enums are the source's enums the tables use, with their labels at the start (ensureTypes).
	enums map[string][]string
	// memberBefore and memberAfter are source positions read before and after the memberships
	// were read at the start (syncMemberships).
	memberBefore, memberAfter pglogrepl.LSN
	// lsn is where the stream starts (prepareSlot) and describedAt a source position read before
	// the tables were described (describe).
	lsn, describedAt pglogrepl.LSN
}

// errSlotMoved ends a session whose slot was moved past the target's progress (or dropped) while
// the session loaded tables; the next session, started at once, records the break in the ledger.
var errSlotMoved = disposition.New("replication slot moved or dropped under the session", disposition.Mark{Action: disposition.Restart, Reason: disposition.ReasonRestart})

// errSlotLost ends a session whose slot the source invalidated (cdc.SlotInfo.Lost) after the session
// began: it removed WAL the slot still needed, past max_slot_wal_keep_size. The next session, after
// a backoff (a load longer than the source keeps WAL for loses the next slot alike), creates the
// slot anew and backfills the gap.
var errSlotLost = disposition.New("replication slot invalidated by the source", disposition.Mark{
	Action: disposition.BackOff,
	Reason: disposition.ReasonSlotLost,
	Hint:   "the source removed WAL the slot still needed because it held more than max_slot_wal_keep_size (a load, or a lag, longer than the source keeps WAL for): raise max_slot_wal_keep_size on the source (ALTER SYSTEM SET max_slot_wal_keep_size = '…'; -1 keeps all), or it happens again at the next load; the next session creates the slot anew and backfills what was not streamed",
})

// errEnumChanged ends a session when an enum a table uses changed its labels on the source; the
// next session, started at once, changes the target's enum alike (a renamed label changes the
// rows that hold it).
var errEnumChanged = disposition.New("enum labels changed on the source", disposition.Mark{
	Action: disposition.Restart,
	Reason: disposition.ReasonRestart,
	Hint:   "an enum label was added or renamed on the source: the next session changes the target's type alike",
})

// errMembershipChanged ends a session when a table's publication membership changed while
// streaming; the next session, started at once, reloads the table.
var errMembershipChanged = disposition.New("publication membership changed", disposition.Mark{Action: disposition.Restart, Reason: disposition.ReasonRestart})

// runSession connects to both sides, prepares the tables and the slot, and streams until ctx ends
// or something fails. A value the target refused as invalid (22P02) while the tables use enums is
// checked against the source's enum labels: a label the source added or renamed since the session
// started explains it (errEnumChanged, the next session changes the target's type alike); when
// the labels cannot be read, it is returned as a transient enumCheckError, so the daemon retries
// rather than stops on what it could not tell apart. It also reports, as connected, whether the
// session reached both the source and the target.
func runSession(parent context.Context, cfg Config) (connected bool, err error) {
	ctx, lost := context.WithCancelCause(parent)
	s := &session{sessionStart: sessionStart{cfg: cfg}, mon: cfg.monitor(), deadline: cfg.newDeadline()}
	defer s.close()
	defer lost(nil)
	err = s.run(ctx, lost)
	if s.epoch != 0 {
		s.mon.Leading(cfg.Slot, false) // between sessions this daemon leads nothing
	}
	if err != nil && parent.Err() == nil {
		if cause := context.Cause(ctx); errors.Is(cause, errLeadershipLost) {
			err = cause
		} else {
			err = s.explainByTakeover(parent, s.timedOut(err))
		}
	}
	connected = s.src != nil && s.tgt != nil
	if err != nil && ctx.Err() == nil && len(s.enums) > 0 && pgsession.IsCode(err, pgerrcode.InvalidTextRepresentation) {
		changed, cerr := s.enumChange(s.bounded(ctx))
		switch {
		case changed != nil:
			return connected, fmt.Errorf("%w: %w", changed, err)
		case cerr != nil:
			return connected, enumCheckError{fmt.Errorf("%w (and the source's enum labels could not be read to tell whether a new label explains it: %w)", err, cerr)}
		}
	}
	return connected, err
}

// enumCheckError is a value the target refused while the source's enum labels, which may explain
// it, could not be read: decide backs off and the next session looks again.
type enumCheckError struct{ err error }

// Mark says that the daemon backs off; the refusal's SQLSTATE names the reason.
func (e enumCheckError) Mark() disposition.Mark { return disposition.Mark{Action: disposition.BackOff} }

// Error returns the refusal's message.
func (e enumCheckError) Error() string { return e.err.Error() }

// Unwrap returns the refusal.
func (e enumCheckError) Unwrap() error { return e.err }

// run is the session's work in order: connect and check, describe the tables and check both
// sides without writing, lead the slot (waiting as a standby while another daemon leads it, then
// describing again; lost ends the session when the leader lock's connection fails), leave the
// selected tables that a running daemon of another slot follows to it (waiting while it follows
// every one: overlap.go), prepare the tables and the publication (holding the epoch: prepare),
// then the slot (loading what needs it), then stream. Each statement of the start has the
// session's statement deadline (bounded), the loads excepted.
func (s *session) run(ctx context.Context, lost context.CancelCauseFunc) error {
	start := s.bounded(ctx)
	s.step("connect")
	if err := s.connect(start); err != nil {
		return err
	}
	s.step("describe")
	describedAt, names, err := s.describe(start)
	if err != nil {
		return err
	}
	s.step("lead")
	waited, err := s.lead(start, lost)
	if err != nil {
		return err
	}
	if waited {
		// The source may have changed while this daemon waited as a standby.
		if describedAt, names, err = s.describe(start); err != nil {
			return err
		}
	}
	if describedAt, names, err = s.settleOverlap(start, describedAt, names); err != nil {
		return err
	}
	if err := s.prepare(start, names); err != nil {
		return err
	}
	s.step("slot")
	startLSN, err := s.prepareSlot(start)
	if err != nil {
		return err
	}
	if err := s.loadSnapshotOnly(ctx); err != nil {
		return err
	}
	s.lsn, s.describedAt = startLSN, describedAt
	s.step("stream")
	return s.stream(ctx)
}

// describe returns a source position read before the tables are described (a Relation message of
// a later transaction that differs from a description is a schema change the description has
// not seen), and the selected tables, described (selectTables); then it checks both sides
// without writing anything (preflight), which opens the replication connection.
func (s *session) describe(ctx context.Context) (pglogrepl.LSN, []changebatch.TableName, error) {
	describedAt, err := cdc.CurrentLSN(ctx, s.src)
	if err != nil {
		return 0, nil, err
	}
	s.tables, s.snapshotOnly, s.patterns = nil, nil, nil
	names, err := s.selectTables(ctx)
	if err != nil {
		return 0, nil, err
	}
	if s.cfg.Knobs.BeforePreflight != nil {
		s.cfg.Knobs.BeforePreflight()
	}
	if err := s.preflight(ctx, names); err != nil {
		return 0, nil, err
	}
	return describedAt, names, nil
}

// connect opens the source and target connections and checks the source.
func (s *session) connect(ctx context.Context) error {
	var err error
	if s.src, err = pgsession.Connect(ctx, s.cfg.Source, "source"); err != nil {
		return err
	}
	if s.tgt, err = pgsession.Connect(ctx, s.cfg.Target, "target"); err != nil {
		return err
	}
	s.ap = apply.New(s.tgt, s.cfg.copyOnly)
	if err := pgsession.CheckDistinct(ctx, s.src, s.tgt); errors.Is(err, pgsession.ErrSameDatabase) {
		return permanent(err)
	} else if err != nil {
		return err
	}
	if err := cdc.CheckSource(ctx, s.src); err != nil {
		return refusal(err)
	}
	if s.sourceID, err = cdc.SourceID(ctx, s.src); err != nil {
		return err
	}
	return s.connectPrimary(ctx)
}

// prepareTarget checks that the ledger follows this source (and that the source was not rewound
// behind it) before it writes anything else, creates or reshapes the target tables and forgets
// the tables the slot no longer replicates. The metadata schema is up to date (lead).
func (s *session) prepareTarget(ctx context.Context) error {
	cfg := s.cfg
	if err := coverage.CheckSource(ctx, s.tgt, cfg.Slot, s.sourceID); err != nil {
		return refusal(err)
	}
	all := append(slices.Clone(s.tables), s.snapshotOnly...)
	for _, t := range all {
		if err := coverage.CheckTableSource(ctx, s.tgt, t.TableName, s.sourceID); err != nil {
			return refusal(err)
		}
	}
	if err := s.checkNotRewound(ctx); err != nil {
		return err
	}
	if err := s.checkTimeline(ctx); err != nil {
		return err
	}
	var err error
	cfg.Knobs.beforeFenced("schema")
	if s.enums, err = backfillrun.EnsureTables(ctx, s.src, s.tgt, all, cfg.Logger); err != nil {
		return err
	}
	if err := s.ensureLiveViews(ctx, all); err != nil {
		return err
	}
	forgotten, err := coverage.ForgetTables(ctx, s.tgt, cfg.Slot, s.tables)
	if err != nil {
		return err
	}
	joined, err := coverage.MarkSnapshotOnly(ctx, s.tgt, all)
	if err != nil {
		return err
	}
	s.joined = map[changebatch.TableName]bool{}
	for _, n := range joined {
		s.joined[n] = true
		cfg.Logger.Info("table kept by snapshots only until now can be streamed: it joins the stream and is loaded from a snapshot while the slot keeps its later changes", "table", n.String())
	}
	for _, t := range forgotten {
		s.mon.CoverageGap(t, 0) // no stream delivers it now: its last gap is no alert any more
	}
	if forgotten, err = s.retireLeft(ctx, forgotten); err != nil {
		return err
	}
	// A streamed table kept by snapshots now (REPLICA IDENTITY NOTHING, say) is still selected.
	forgotten = slices.DeleteFunc(forgotten, func(t string) bool {
		return slices.ContainsFunc(s.snapshotOnly, func(k changebatch.Table) bool { return k.String() == t })
	})
	for _, t := range forgotten {
		cfg.Logger.Error("table no longer selected: no stream follows it now, and coverage reports it not-streamed (which fails --fail-on-gap) until it is selected again, then loaded again, or retired with pgconverge retire --table "+t,
			"table", t, "slot", cfg.Slot)
	}
	// Per-table counters start at 0, so that a verify's first findings are an increase that
	// rate() and increase() see.
	for _, t := range s.tables {
		for _, k := range []reconcile.Kind{reconcile.Missing, reconcile.Extra, reconcile.Different} {
			s.mon.DiscrepanciesFound(t.String(), string(k), 0)
		}
		s.mon.DiscrepanciesRepaired(t.String(), 0)
		s.mon.DiscrepanciesSuppressed(t.String(), 0)
	}
	unretired, err := coverage.Unretire(ctx, s.tgt, all)
	if err != nil {
		return err
	}
	for _, n := range unretired {
		cfg.Logger.Info("table retired earlier is selected again: it is followed again and loaded from a new snapshot", "table", n.String())
	}
	return nil
}

// preparePublication adds the selected tables to the publication (marking the ones it adds for
// loading first), warns about published tables not selected, and records the memberships.
func (s *session) preparePublication(ctx context.Context, names []changebatch.TableName) error {
	cfg := s.cfg
	added, err := cdc.EnsurePublication(ctx, s.publisher(), cfg.Publication, names, s.publishHooks(ctx))
	if err = s.published(ctx, added, err); err != nil {
		return err
	}
	for _, t := range added {
		cfg.Logger.Info("published table", "publication", cfg.Publication, "table", t.String())
	}
	if err := s.warnUnselected(ctx, names); err != nil {
		return err
	}
	return s.syncMemberships(ctx, names)
}

func (s *session) close() {
	ctx := context.Background()
	if s.watching != nil {
		<-s.watching
	}
	for _, c := range []*pgx.Conn{s.src, s.tgt, s.lock, s.primary} {
		if c != nil {
			c.Close(ctx)
		}
	}
	if s.repl != nil {
		s.repl.Close(ctx)
	}
}

// described returns the descriptions of the named selected tables.
func (s *session) described(names []changebatch.TableName) []changebatch.Table {
	want := map[changebatch.TableName]bool{}
	for _, n := range names {
		want[n] = true
	}
	var out []changebatch.Table
	for _, t := range s.tables {
		if want[t.TableName] {
			out = append(out, t)
		}
	}
	return out
}
