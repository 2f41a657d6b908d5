package engine

import (
	"context"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/coverage/gaps"
	"github.com/pgconverge/pgconverge/internal/overlap"
)

// coverageStart is where a session's stream starts covering, for the ledger.
type coverageStart struct {
	// Stream is the LSN the stream starts from.
	Stream pglogrepl.LSN
	// Created is the consistent point of a slot created by this session, else 0.
	Created pglogrepl.LSN
	// Break, when set, says why the slot's open segment ended: the stream does not continue it.
	Break string
}

// recordCoverage writes, in one target transaction, what the session's start established: spans
// of tables that left the selection or whose publication membership changed since their span
// began end; the others are confirmed published; the slot's segment ends when the stream does not
// continue it, and a new one starts; every selected table gets a span from where the stream starts
// applying it (from st.Stream, or for a table that joined the publication since its latest span
// began, from a position read after the join). Deciding from the spans' own membership tokens, in
// this one transaction, means a session that dies half-way leaves nothing half-recorded. The
// transaction first claims the tables (overlap.Claim: none may be followed by a running daemon of
// another slot) and records the snapshot-only tables this slot keeps.
func (s *session) recordCoverage(ctx context.Context, st coverageStart) error {
	cfg := s.cfg
	tx, err := s.tgt.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := apply.CheckLeaderTx(ctx, tx, cfg.Slot, s.epoch); err != nil {
		return err
	}
	if err := overlap.Claim(ctx, s.tgt, tx, cfg.Slot, s.names, s.snapshotOnlyNames(), cfg.Logger); err != nil {
		return err
	}
	latest, err := coverage.LatestSpans(ctx, tx, cfg.Slot, s.names)
	if err != nil {
		return err
	}
	// A table whose latest span began with the membership it has now stayed in the publication
	// since: the stream covers it from where it starts. Otherwise it joined at an unknown point
	// before memberAfter (read after the membership), and its open span, if any, ends.
	var joined, unchanged []changebatch.TableName
	starts := map[changebatch.TableName]coverage.SpanStart{}
	for _, n := range s.names {
		tok := s.memberships[n]
		l, ok := latest[n]
		start := coverage.SpanStart{LSN: st.Stream, Membership: tok}
		if !ok || l.Membership != tok {
			start.LSN = max(st.Stream, s.memberAfter)
			if ok && l.Open {
				joined = append(joined, n)
			}
		} else if l.Open {
			unchanged = append(unchanged, n)
		}
		starts[n] = start
	}
	if _, err := coverage.EndSpansExcept(ctx, tx, cfg.Slot, s.names, coverage.ReasonDeselected); err != nil {
		return err
	}
	if err := coverage.EndSpans(ctx, tx, cfg.Slot, joined, coverage.ReasonMembership); err != nil {
		return err
	}
	if err := coverage.ConfirmSpans(ctx, tx, cfg.Slot, unchanged, s.memberBefore); err != nil {
		return err
	}
	seg, open, err := coverage.OpenSegment(ctx, tx, cfg.Slot)
	if err != nil {
		return err
	}
	if st.Break != "" || !open {
		if open {
			if _, err := coverage.EndSegment(ctx, tx, cfg.Slot, seg.End, st.Break); err != nil {
				return err
			}
			cfg.Logger.Error("stream coverage broken: changes between these LSNs were not streamed; every table the slot followed has a coverage gap",
				"slot", cfg.Slot, "reason", st.Break, "from_lsn", seg.End.String(), "to_lsn", st.Stream.String(),
				"bytes", uint64(max(st.Stream, seg.End)-seg.End), "on_gap", cfg.OnGap)
		}
		if st.Created != 0 {
			err = apply.StartSlot(ctx, tx, cfg.Slot, st.Created)
		} else {
			err = apply.SetProgressTx(ctx, tx, cfg.Slot, st.Stream)
		}
		if err != nil {
			return err
		}
		if _, err := coverage.StartSegment(ctx, tx, cfg.Slot, st.Created, st.Stream); err != nil {
			return err
		}
	}
	if err := coverage.UseSource(ctx, tx, cfg.Slot, cfg.Publication, s.sourceID); err != nil {
		return err
	}
	if s.timeline != 0 {
		if err := coverage.RecordTimeline(ctx, tx, cfg.Slot, s.timeline); err != nil {
			return err
		}
	}
	if _, err := coverage.StartSpans(ctx, tx, cfg.Slot, starts); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// loadPlan is what a session loads before it streams (tablesToLoad).
type loadPlan struct {
	// load are the tables that never completed a backfill of their target table (or must be
	// loaded again: kept by snapshots until now, or changed on the source in a way no streamed
	// change shows), of trigger (coverage.TriggerInitial or TriggerSchemaChange).
	load    []changebatch.Table
	trigger string
	// gapped are the tables with a coverage gap or without a load their slot followed, which
	// --on-gap=repair repairs and --on-gap=backfill backfills (none with --on-gap=alert).
	gapped []changebatch.Table
}

// tablesToLoad returns the selected tables to load before streaming: every table that never
// completed a backfill of its target table, and, unless --on-gap=alert, every table with a
// coverage gap or without a load its slot followed (loaded, as coverage.LoadedTables; nil when
// none counts). Each gap is logged at ERROR.
func (s *session) tablesToLoad(ctx context.Context, loaded map[string]pglogrepl.LSN) (loadPlan, error) {
	states, err := coverage.ReadTables(ctx, s.tgt)
	if err != nil {
		return loadPlan{}, err
	}
	p := loadPlan{trigger: coverage.TriggerInitial}
	for _, t := range s.tables {
		st := states[t.TableName]
		if st == nil || st.Backfilled == 0 || s.joined[t.TableName] {
			why := "never loaded into its target table"
			if st != nil {
				s.mon.CoverageGap(t.String(), gaps.Total(gaps.Find(st.Ledger)))
				switch {
				case s.joined[t.TableName]:
					why = "kept by snapshots only until now, it joins the stream"
				case st.SchemaChanged != 0:
					why = "the source table changed in a way no streamed change shows"
					p.trigger = coverage.TriggerSchemaChange
				}
			}
			s.cfg.Logger.Info("table to load", "table", t.String(), "why", why)
			p.load = append(p.load, t)
			continue
		}
		found := gaps.Find(st.Ledger)
		s.mon.CoverageGap(t.String(), gaps.Total(found))
		for _, g := range found {
			logGap(s.cfg, t.String(), st, g)
		}
		_, isLoaded := loaded[t.String()]
		switch {
		case len(found) == 0 && isLoaded:
		case s.cfg.OnGap != OnGapAlert:
			p.gapped = append(p.gapped, t)
		case len(found) > 0:
			s.cfg.Logger.Warn("not backfilling a table with a coverage gap (--on-gap=alert): run pgconverge backfill for it to close the gap",
				"table", t.String())
		}
	}
	return p, nil
}

// loadPlanned loads what p names before streaming: with --on-gap=repair it first repairs the
// gapped tables by comparison (repairGaps) at snap (nil: a snapshot of its own), then backfills,
// in one run from snap (loadTables, keeping chunks completed at or above keepFrom), the tables to
// load and the gapped tables not repaired (trigger "gap" when there is one of those).
func (s *session) loadPlanned(ctx context.Context, p loadPlan, snap *backfill.Snapshot, keepFrom pglogrepl.LSN) error {
	gapped := p.gapped
	if s.cfg.OnGap == OnGapRepair && len(gapped) > 0 {
		var err error
		if gapped, err = s.repairGaps(ctx, gapped, snap); err != nil {
			return err
		}
	}
	load, trigger := p.load, p.trigger
	if len(gapped) > 0 {
		load, trigger = append(load, gapped...), coverage.TriggerGap
	}
	if len(load) == 0 {
		return nil
	}
	return s.loadTables(ctx, load, trigger, snap, keepFrom)
}

// logGap logs gap g of table (whose ledger is st) at ERROR.
func logGap(cfg Config, table string, st *coverage.TableState, g gaps.Gap) {
	keys := "all"
	if g.Chunks != nil {
		keys = coverage.DescribeKeys(st.Ledger.Chunks, g.Chunks)
	}
	cfg.Logger.Error("coverage gap: no backfill and no stream delivered this table's changes between these LSNs",
		"table", table, "from_lsn", g.From.String(), "to_lsn", g.To.String(), "bytes", g.Bytes(), "keys", keys,
		"on_gap", cfg.OnGap)
}

// publishCoverage recomputes the selected tables' gaps from the ledger for the metrics, over the
// session's target connection; with logRemaining it logs the gaps that remain after the loads of
// --on-gap=backfill at ERROR.
func (s *session) publishCoverage(ctx context.Context, logRemaining bool) error {
	return publishGaps(ctx, s.tgt, s.cfg, s.mon, s.tables, logRemaining)
}

// publishGaps reads the ledger's tables over db and reports the gaps of tables to mon; with
// logRemaining (and --on-gap other than alert) it logs each gap at ERROR.
func publishGaps(ctx context.Context, db coverage.DB, cfg Config, mon Monitor, tables []changebatch.Table, logRemaining bool) error {
	states, err := coverage.ReadTables(ctx, db)
	if err != nil {
		return err
	}
	for _, t := range tables {
		st := states[t.TableName]
		if st == nil {
			continue
		}
		found := gaps.Find(st.Ledger)
		mon.CoverageGap(t.String(), gaps.Total(found))
		if logRemaining && cfg.OnGap != OnGapAlert {
			for _, g := range found {
				logGap(cfg, t.String(), st, g)
			}
		}
	}
	return nil
}

// reloadFences returns each selected table's schema_changed_lsn by source oid (see
// cdc.StreamConfig.ReloadFences).
func (s *session) reloadFences(ctx context.Context) (map[uint32]pglogrepl.LSN, error) {
	states, err := coverage.ReadTables(ctx, s.tgt)
	if err != nil {
		return nil, err
	}
	fences := map[uint32]pglogrepl.LSN{}
	for _, t := range s.tables {
		if st := states[t.TableName]; st != nil && t.SourceOID != 0 {
			fences[t.SourceOID] = st.SchemaChanged
		}
	}
	return fences, nil
}
