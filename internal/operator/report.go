package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// CoverageConfig configures CoverageReport (`pgconverge coverage`).
type CoverageConfig struct {
	Source, Target string
	// Slot is the slot to describe when no stream follows any table yet (streamed tables name
	// their own).
	Slot string
	// Standbys are URLs of physical standbys of the source on which to check that each slot's
	// copy is ready for a failover (PostgreSQL 17 and later; coverage.FailoverReadiness).
	Standbys []string
}

// Validate reports every problem of the configuration at once.
func (c *CoverageConfig) Validate() error {
	errs := pgsession.ValidateURLs(c.Source, c.Target)
	if err := cdc.ValidateSlotName(c.Slot); err != nil {
		errs = append(errs, err)
	}
	for _, u := range c.Standbys {
		if _, err := pgx.ParseConfig(u); err != nil {
			errs = append(errs, fmt.Errorf("--standby %q: %w", u, err))
		}
	}
	return errors.Join(errs...)
}

// CoverageReport is `pgconverge coverage`: the coverage report of the target's ledger against the
// source. It gathers the
// facts coverage.NewReport needs in the order its doc gives (slots before the ledger, the rest
// after). Errors: no ledger on the target, a failed read, and coverage.ErrOtherSource when the
// source is not the database the ledger follows or is behind its watermark.
func CoverageReport(ctx context.Context, cfg CoverageConfig) (coverage.Report, error) {
	src, tgt, err := pgsession.ConnectBoth(ctx, cfg.Source, cfg.Target)
	if err != nil {
		return coverage.Report{}, err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), src, tgt)
	if err := coverage.CheckLedger(ctx, tgt); err != nil {
		return coverage.Report{}, err
	}
	var f coverage.Facts
	names, err := coverage.OpenSlots(ctx, tgt)
	if err != nil {
		return coverage.Report{}, err
	}
	if len(names) == 0 {
		// A slot that was cut over ended its replication on purpose: it is no slot to report.
		if _, cut, err := coverage.ReadCutover(ctx, tgt, cfg.Slot); err != nil {
			return coverage.Report{}, err
		} else if !cut {
			names = []string{cfg.Slot}
		}
	}
	if f.SourceLSN, err = cdc.CurrentLSN(ctx, src); err != nil {
		return coverage.Report{}, err
	}
	if f.Slots, err = readSlotsHealth(ctx, src, names, f.SourceLSN, cfg.Standbys); err != nil {
		return coverage.Report{}, err
	}
	states, err := coverage.ReadTables(ctx, tgt)
	if err != nil {
		return coverage.Report{}, err
	}
	if f.SourceID, err = cdc.SourceID(ctx, src); err != nil {
		return coverage.Report{}, err
	}
	if f.AfterLSN, err = cdc.CurrentLSN(ctx, src); err != nil {
		return coverage.Report{}, err
	}
	// A wrong source is refused before anything else of it is read.
	if err := coverage.CheckStreamSource(states, f.SourceID, f.AfterLSN); err != nil {
		return coverage.Report{}, err
	}
	if err := sourceFacts(ctx, src, tgt, states, names, &f); err != nil {
		return coverage.Report{}, err
	}
	if f.Waits, err = runningWaits(ctx, tgt); err != nil {
		return coverage.Report{}, err
	}
	return coverage.NewReport(states, f)
}

// runningWaits returns the recorded waits (coverage.ReadWaits) of the slots a daemon of which runs
// now (apply.ReadLeaders): a stopped daemon waits for nothing.
func runningWaits(ctx context.Context, tgt *pgx.Conn) ([]coverage.Wait, error) {
	waits, err := coverage.ReadWaits(ctx, tgt)
	if err != nil || len(waits) == 0 {
		return nil, err
	}
	leaders, err := apply.ReadLeaders(ctx, tgt)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(waits, func(w coverage.Wait) bool { return !leaders[w.Slot].Running }), nil
}

// sourceFacts fills in the facts about the streamed tables: the slots named beyond listed (a
// segment opened after they were read), the tables' current publication memberships, their
// source changes no stream shows (apply.ShapeChanges; a table the source no longer has is left to
// the membership check) and the backfill locks held.
func sourceFacts(ctx context.Context, src, tgt *pgx.Conn, states map[changebatch.TableName]*coverage.TableState, listed []string, f *coverage.Facts) error {
	seen := map[string]bool{}
	for _, n := range listed {
		seen[n] = true
	}
	byPublication := map[string][]changebatch.TableName{}
	f.Memberships, f.SourceChanges, f.Held = map[changebatch.TableName]string{}, map[changebatch.TableName][]string{}, map[changebatch.TableName]bool{}
	f.RowFilters, f.ColumnLists = map[changebatch.TableName]string{}, map[changebatch.TableName][]string{}
	for n, st := range states {
		if !st.Streaming {
			continue
		}
		if !seen[st.Slot] {
			seen[st.Slot] = true
			more, err := readSlotsHealth(ctx, src, []string{st.Slot}, f.SourceLSN, nil)
			if err != nil {
				return err
			}
			f.MoreSlots = append(f.MoreSlots, more...)
		}
		byPublication[st.Publication] = append(byPublication[st.Publication], n)
		// A table the source cannot describe, or whose publication it cannot fit, is left to the
		// membership check and to the daemon, which name the problem.
		if t, err := cdc.DescribeTable(ctx, src, n.Schema, n.Name); err == nil && cdc.ReadPublicationShape(ctx, src, st.Publication, &t) == nil {
			if t.RowFilter != "" {
				f.RowFilters[n] = t.RowFilter
			}
			if t.ColumnList {
				for _, c := range t.Columns {
					f.ColumnLists[n] = append(f.ColumnLists[n], c.Name)
				}
			}
			if f.SourceChanges[n], err = apply.ShapeChanges(ctx, tgt, t); err != nil {
				return err
			}
		}
		held, err := coverage.BackfillHeld(ctx, tgt, n)
		if err != nil {
			return err
		}
		f.Held[n] = held
	}
	for pub, names := range byPublication {
		got, err := cdc.Memberships(ctx, src, pub, names)
		if err != nil {
			return err
		}
		for n, tok := range got {
			f.Memberships[n] = tok
		}
	}
	return nil
}

// readSlotsHealth returns the health of the named slots on src (cdc.ReadSlot), with their failover
// readiness (readFailover, checked on the standby URLs standbys too); now is the source's current
// position. A slot of another database counts as missing.
func readSlotsHealth(ctx context.Context, src *pgx.Conn, names []string, now pglogrepl.LSN, standbys []string) ([]coverage.SlotHealth, error) {
	out := make([]coverage.SlotHealth, 0, len(names))
	for _, name := range names {
		h, err := engine.ReadSlotHealth(ctx, src, name, now)
		if err != nil {
			return nil, err
		}
		if h.Failover, err = readFailover(ctx, src, name, standbys); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}
