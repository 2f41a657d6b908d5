package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/migrations"
)

// session is one connected attempt of the daemon: checks, preparation, loads, then streaming.
type session struct {
	cfg         daemonConfig
	cancel      context.CancelCauseFunc
	names       []cdc.TableName
	memberships map[cdc.TableName]string // publication membership of each table at the start
	src         *pgx.Conn
	tgt         *pgx.Conn
	repl        *pgconn.PgConn
	ap          *apply.Applier
	tables      []changebatch.Table
	sourceID    string // cdc.SourceID of the source
	// enums are the source's enums the tables use, with their labels at the start (ensureTypes).
	enums map[string][]string
	// memberBefore and memberAfter are source positions read before and after the memberships
	// were read at the start (syncMemberships).
	memberBefore, memberAfter pglogrepl.LSN
	// confirmed is a source position up to which every table was published as at the start,
	// offered by checkMemberships to the stream, which records it (coverage.ConfirmSpans);
	// recorded is the last position recorded. lastCheck belongs to checkMemberships.
	confirmed           atomic.Uint64
	recorded, lastCheck pglogrepl.LSN
	// gapsPublished is when the gap metric was last computed (publishCoverage).
	gapsPublished time.Time
}

// errSlotMoved ends a session whose slot was moved past the target's progress (or dropped) while
// the session loaded tables; the next session records the break in the ledger.
var errSlotMoved = errors.New("replication slot moved during the session's start")

// checkSlotStart returns an error wrapping errSlotMoved when the slot, now held by this session's
// walsender, no longer starts at start. It reads the slot over a connection of its own: the
// session's source connection belongs to the WAL sampler by now.
func (s *session) checkSlotStart(ctx context.Context, start pglogrepl.LSN) error {
	conn, err := pgsession.Connect(ctx, s.cfg.Source, "source")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	slot, err := cdc.ReadSlot(ctx, conn, s.cfg.Slot)
	if err != nil {
		return err
	}
	if !slot.Exists || slot.Lost() || slot.ConfirmedFlush > start {
		return fmt.Errorf("%w: slot %q (exists %v, wal_status %q, confirmed_flush_lsn %s) no longer starts at the target's progress %s; restarting the session to record the gap",
			errSlotMoved, s.cfg.Slot, slot.Exists, slot.WALStatus, slot.ConfirmedFlush, start)
	}
	return nil
}

// errEnumChanged ends a session when an enum a table uses changed its labels on the source; the
// next session changes the target's enum alike (a renamed label changes the rows that hold it).
var errEnumChanged = errors.New("enum labels changed on the source")

// errMembershipChanged ends a session when a table's publication membership changed while
// streaming; the next session reloads the table.
var errMembershipChanged = errors.New("publication membership changed")

// runSession connects to both sides and streams until ctx ends or something fails.
func runSession(ctx context.Context, cfg daemonConfig) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s := &session{cfg: cfg, cancel: cancel}
	defer s.close()
	var err error
	if s.src, err = pgsession.Connect(ctx, cfg.Source, "source"); err != nil {
		return err
	}
	if s.tgt, err = pgsession.Connect(ctx, cfg.Target, "target"); err != nil {
		return err
	}
	s.ap = apply.New(s.tgt)
	if err := checkDistinct(ctx, s.src, s.tgt); err != nil {
		return err
	}
	if err := cdc.CheckSource(ctx, s.src); err != nil {
		return permanent(err)
	}
	if s.sourceID, err = cdc.SourceID(ctx, s.src); err != nil {
		return err
	}
	// Read before the tables are described: a Relation message of a later transaction that
	// differs from a description is a schema change the description has not seen.
	describedAt, err := cdc.CurrentLSN(ctx, s.src)
	if err != nil {
		return err
	}
	names, err := s.selectTables(ctx)
	if err != nil {
		return err
	}
	if err := migrations.Apply(ctx, s.tgt); err != nil {
		return err
	}
	if err := coverage.CheckSource(ctx, s.tgt, cfg.Slot, s.sourceID); err != nil {
		return permanent(err)
	}

	if s.enums, err = ensureTables(ctx, s.src, s.tgt, s.tables, cfg.Logger); err != nil {
		return err
	}
	for _, t := range s.tables {
		if err := coverage.CheckTableSource(ctx, s.tgt, cdc.TableName{Schema: t.Schema, Name: t.Name}, s.sourceID); err != nil {
			return permanent(err)
		}
	}
	forgotten, err := apply.ForgetTables(ctx, s.tgt, cfg.Slot, s.tables)
	if err != nil {
		return err
	}
	for _, t := range forgotten {
		cfg.Logger.Warn("table no longer replicated: its target copy stops following the source and is loaded again if it is selected again",
			"table", t, "slot", cfg.Slot)
	}
	added, err := cdc.EnsurePublication(ctx, s.src, cfg.Publication, names, func(adding []cdc.TableName) error {
		return apply.MarkUnloaded(ctx, s.tgt, s.described(adding))
	})
	if err != nil {
		return err
	}
	for _, t := range added {
		cfg.Logger.Info("published table", "publication", cfg.Publication, "table", t.String())
	}
	if err := s.warnUnselected(ctx, names); err != nil {
		return err
	}
	if err := s.syncMemberships(ctx, names); err != nil {
		return err
	}
	if s.repl, err = pgsession.ConnectReplication(ctx, cfg.Source); err != nil {
		return err
	}
	start, err := s.prepareSlot(ctx)
	if err != nil {
		return err
	}
	walEnd, stopSampling := s.sampleWALEnd(ctx)
	defer stopSampling()
	stopSchedule := s.startSchedule(ctx, start)
	defer stopSchedule()
	fences, err := s.reloadFences(ctx)
	if err != nil {
		return err
	}
	streamer, err := cdc.NewStreamer(cdc.StreamConfig{
		Slot: cfg.Slot, Publication: cfg.Publication, Start: start, Tables: s.tables, DescribedAt: describedAt,
		ReloadFences: fences,
		Apply:        s.applyStream, SourceWALEnd: walEnd, Logger: cfg.Logger, Knobs: cfg.Knobs.Stream,
		CheckStart: func(ctx context.Context) error { return s.checkSlotStart(ctx, start) },
	})
	if err != nil {
		return permanent(err)
	}
	cfg.Metrics.follow(streamer.Stats)
	defer cfg.Metrics.follow(nil)
	err = streamer.Run(ctx, s.repl)
	var schema *cdc.SchemaChangeError
	if cause := context.Cause(ctx); errors.Is(cause, errMembershipChanged) || errors.Is(cause, errEnumChanged) || errors.As(cause, &schema) {
		err = cause
	}
	if errors.As(err, &schema) {
		cfg.Logger.Warn("source table changed while streaming (columns, key or storage): restarting the session to follow it",
			"table", schema.Table.String(), "lsn", schema.LSN.String(), "added", schema.Added,
			"dropped_or_renamed", schema.Dropped, "changed_type", schema.Retyped, "rewritten", schema.Rewritten,
			"key_changed", schema.KeyChanged, "reload", schema.Reload)
		if schema.Reload {
			// The transaction at LSN is left to a backfill read after it.
			if rerr := apply.RecordSchemaChange(context.WithoutCancel(ctx), s.tgt, schema.Table, schema.LSN+1); rerr != nil {
				return rerr
			}
		}
	}
	return err
}

func (s *session) close() {
	ctx := context.Background()
	for _, c := range []*pgx.Conn{s.src, s.tgt} {
		if c != nil {
			c.Close(ctx)
		}
	}
	if s.repl != nil {
		s.repl.Close(ctx)
	}
}

// selectTables resolves the replicated tables and describes them; problems are permanent and
// reported all at once.
func (s *session) selectTables(ctx context.Context) ([]cdc.TableName, error) {
	var names []cdc.TableName
	if len(s.cfg.Tables) > 0 {
		for _, list := range s.cfg.Tables {
			for _, n := range changebatch.SplitTableList(list) {
				schema, name, err := changebatch.ParseTableName(n)
				if err != nil {
					return nil, permanent(fmt.Errorf("--tables: %w", err))
				}
				names = append(names, cdc.TableName{Schema: schema, Name: name})
			}
		}
	} else {
		var skipped []cdc.SkippedTable
		var err error
		if names, skipped, err = cdc.DefaultTables(ctx, s.src, s.cfg.Publication); err != nil {
			return nil, err
		}
		for _, sk := range skipped {
			s.cfg.Logger.Warn("skipping table", "table", sk.Table.String(), "reason", sk.Reason)
		}
		if len(names) == 0 {
			return nil, permanent(errors.New("no table to replicate: the source has no table with a primary key; name tables with --tables"))
		}
	}
	var errs []error
	for _, n := range names {
		t, err := cdc.DescribeTable(ctx, s.src, n.Schema, n.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.tables = append(s.tables, t)
	}
	if len(errs) > 0 {
		return nil, permanent(errors.Join(errs...))
	}
	return names, nil
}

// checkDistinct refuses a target that is the source database under another URL (another host
// name for the same server, say): the server's start time and the database's oid identify it.
func checkDistinct(ctx context.Context, src, tgt *pgx.Conn) error {
	const q = `select pg_postmaster_start_time()::text || '/' || (select oid from pg_database where datname = current_database())::text`
	var a, b string
	if err := src.QueryRow(ctx, q).Scan(&a); err != nil {
		return fmt.Errorf("identify source database: %w", err)
	}
	if err := tgt.QueryRow(ctx, q).Scan(&b); err != nil {
		return fmt.Errorf("identify target database: %w", err)
	}
	if a == b {
		return permanent(errors.New("source and target URLs reach the same database: replicate into another database"))
	}
	return nil
}

// described returns the descriptions of the named selected tables.
func (s *session) described(names []cdc.TableName) []changebatch.Table {
	want := map[string]bool{}
	for _, n := range names {
		want[n.String()] = true
	}
	var out []changebatch.Table
	for _, t := range s.tables {
		if want[t.String()] {
			out = append(out, t)
		}
	}
	return out
}

// warnUnselected logs each table of the publication that is not replicated: the slot passes over
// its changes, so its target copy (if any) stops following the source.
func (s *session) warnUnselected(ctx context.Context, selected []cdc.TableName) error {
	published, err := cdc.PublishedTables(ctx, s.src, s.cfg.Publication)
	if err != nil {
		return err
	}
	sel := map[cdc.TableName]bool{}
	for _, n := range selected {
		sel[n] = true
	}
	for _, n := range published {
		if !sel[n] {
			s.cfg.Logger.Warn("published table not selected: its changes are skipped; name it in --tables to replicate it (it is then loaded first)",
				"table", n.String(), "publication", s.cfg.Publication)
		}
	}
	return nil
}

// applyStream is the stream's ApplyFunc: one target transaction with the batches, the progress
// and, every few seconds, the position up to which the tables' publication membership is
// confirmed.
func (s *session) applyStream(ctx context.Context, batches []arrow.RecordBatch, end pglogrepl.LSN) error {
	began := time.Now()
	tx, err := s.ap.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	results := map[string]apply.Result{}
	for _, b := range batches {
		res, err := tx.Apply(ctx, b)
		if err != nil {
			return err
		}
		tab, err := changebatch.TableOf(b.Schema())
		if err != nil {
			return err
		}
		r := results[tab.String()]
		r.Add(res)
		results[tab.String()] = r
	}
	if err := tx.SetProgress(ctx, s.cfg.Slot, end); err != nil {
		return err
	}
	confirmed := pglogrepl.LSN(s.confirmed.Load())
	if confirmed > s.recorded {
		if err := coverage.ConfirmSpans(ctx, tx.Conn(), s.cfg.Slot, s.names, confirmed); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	s.recorded = max(s.recorded, confirmed)
	s.cfg.Metrics.streamApplied(results, time.Since(began))
	if s.cfg.Metrics != nil && time.Since(s.gapsPublished) >= gapRefreshEvery {
		if err := s.publishCoverage(ctx, false); err != nil {
			return err
		}
	}
	if len(batches) > 0 {
		s.cfg.Logger.Debug("applied", "lsn", end.String(), "applied", tx.Result.Applied,
			"suppressed", tx.Result.Suppressed, "merged", tx.Result.Merged, "truncates", tx.Result.Truncates)
	}
	return nil
}
