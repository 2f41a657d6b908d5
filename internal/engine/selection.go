package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/disposition"
)

// selectTables resolves the replicated tables and describes them; problems are permanent and
// reported all at once.
func (s *session) selectTables(ctx context.Context) ([]changebatch.TableName, error) {
	var names []changebatch.TableName
	if len(s.cfg.Tables) > 0 {
		var err error
		if names, s.patterns, err = changebatch.ParseTableSelection(s.cfg.Tables); err != nil {
			return nil, permanent(fmt.Errorf("--tables: %w", err))
		}
		if names, err = s.withMatches(ctx, s.src, names, true); err != nil {
			return nil, err
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
		if names, err = s.withKeptBySnapshots(ctx, names); err != nil {
			return nil, err
		}
		if len(names) == 0 {
			return nil, permanent(errors.New("no table to replicate: the source database has no table pgconverge can carry (an ordinary table, or a partitioned one with a primary key); create one, or name tables with --tables"))
		}
	}
	var errs []error
	noKey := map[changebatch.TableName]string{} // why each has no key, "" for no usable one
	for _, n := range names {
		t, err := cdc.DescribeTable(ctx, s.src, n.Schema, n.Name)
		if err == nil {
			err = cdc.ReadPublicationShape(ctx, s.src, s.cfg.Publication, &t)
		}
		if err != nil {
			errs = append(errs, err)
			if errors.Is(err, changebatch.ErrNoKey) {
				noKey[n] = ""
			}
			continue
		}
		if t.SnapshotOnly != "" {
			if t.SnapshotOnly == cdc.SnapshotOnlyNoKey || t.SnapshotOnly == cdc.SnapshotOnlyDeferrable {
				noKey[n] = t.SnapshotOnly // waited for if it was streamed: see below
			}
			s.snapshotOnly = append(s.snapshotOnly, t)
			continue
		}
		s.tables = append(s.tables, t)
	}
	if err := s.waitForLostKeys(ctx, noKey, errs); err != nil {
		return nil, err
	}
	if len(errs) == 0 {
		var streamed []changebatch.TableName
		for _, t := range s.tables {
			streamed = append(streamed, t.TableName)
		}
		for _, t := range s.snapshotOnly {
			s.cfg.Logger.Warn("table kept by snapshots only: no publication can carry its changes; it is loaded, then backfilled again at each --snapshot-schedule tick",
				"table", t.String(), "reason", t.SnapshotOnly)
		}
		followed := make([]string, len(streamed))
		for i, n := range streamed {
			followed[i] = n.String()
		}
		selection := "the publication's tables (no --tables)"
		if len(s.cfg.Tables) > 0 {
			selection = "--tables " + strings.Join(s.cfg.Tables, ",")
		}
		s.cfg.Logger.Info("following tables", "count", len(streamed), "tables", strings.Join(followed, ", "),
			"snapshot_only", len(s.snapshotOnly), "selection", selection)
		return streamed, nil
	}
	return nil, refusal(errors.Join(errs...))
}

// waitForLostKeys returns a keyLostError when a table of noKey (described without a key, with
// the reason when it has one) is one a stream follows already: it lost its key (a primary key
// dropped to be added on other columns, or made DEFERRABLE), and the daemon waits, as the DBA is
// usually about to add the new one; errs are the other problems found, reported with it.
func (s *session) waitForLostKeys(ctx context.Context, noKey map[changebatch.TableName]string, errs []error) error {
	if len(noKey) == 0 {
		return nil
	}
	streamed, err := s.streamedTables(ctx)
	if err != nil {
		return err
	}
	var lost []error
	for _, n := range slices.SortedFunc(maps.Keys(noKey), func(a, b changebatch.TableName) int { return strings.Compare(a.String(), b.String()) }) {
		if !streamed[n] {
			continue
		}
		if why := noKey[n]; why != "" && why != cdc.SnapshotOnlyNoKey {
			lost = append(lost, fmt.Errorf("table %s has no usable key now: %s: %w", n, why, changebatch.ErrNoKey))
			continue
		}
		lost = append(lost, fmt.Errorf("table %s has no primary key or replica identity index: add one (ALTER TABLE %s ADD PRIMARY KEY (...)), or replicate it by its whole rows (ALTER TABLE %s REPLICA IDENTITY FULL): %w",
			n, n.Quoted(), n.Quoted(), changebatch.ErrNoKey))
	}
	if len(lost) == 0 {
		return nil
	}
	return keyLostError{errors.Join(append(errs, lost...)...)}
}

// withKeptBySnapshots returns names, the default selection, with the tables the target keeps by
// snapshots that the source still has as candidates (cdc.CandidateTables): such a table is in no
// publication, so one that became streamable (SET LOGGED, a key, REPLICA IDENTITY FULL) is still
// selected, and the session publishes it and loads it at the seam.
func (s *session) withKeptBySnapshots(ctx context.Context, names []changebatch.TableName) ([]changebatch.TableName, error) {
	if ok, err := apply.HasMetadata(ctx, s.tgt); err != nil || !ok {
		return names, err
	}
	kept, err := coverage.KeptBySnapshots(ctx, s.tgt)
	if err != nil || len(kept) == 0 {
		return names, err
	}
	candidates, _, err := cdc.CandidateTables(ctx, s.src)
	if err != nil {
		return nil, err
	}
	for _, n := range kept {
		if slices.Contains(candidates, n) && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names, nil
}

// keyLostError is a description refused because a table the target already follows has no key
// now: decide backs off, and the next session describes it again.
type keyLostError struct{ err error }

// Mark says that the daemon backs off (reason "schema") and describes the table again.
func (e keyLostError) Mark() disposition.Mark {
	return disposition.Mark{Action: disposition.BackOff, Reason: disposition.ReasonSchema}
}

// Error returns the refusal's message.
func (e keyLostError) Error() string {
	return e.err.Error() + " (the table is replicated already: the daemon waits for a key and tries again)"
}

// Unwrap returns the refusal.
func (e keyLostError) Unwrap() error { return e.err }

// streamedTables returns the tables the target's pgconverge.tables registers as streamed (not
// kept by snapshots only), none when the target has no metadata schema yet.
func (s *session) streamedTables(ctx context.Context) (map[changebatch.TableName]bool, error) {
	out := map[changebatch.TableName]bool{}
	if ok, err := apply.HasMetadata(ctx, s.tgt); err != nil || !ok {
		return out, err
	}
	names, err := coverage.StreamedTables(ctx, s.tgt)
	for _, n := range names {
		out[n] = true
	}
	return out, err
}

// warnUnselected logs each table of the publication that is not replicated: the slot passes over
// its changes, so its target copy (if any) stops following the source.
func (s *session) warnUnselected(ctx context.Context, selected []changebatch.TableName) error {
	published, err := cdc.PublishedTables(ctx, s.src, s.cfg.Publication)
	if err != nil {
		return err
	}
	sel := map[changebatch.TableName]bool{}
	for _, n := range selected {
		sel[n] = true
	}
	kept := map[changebatch.TableName]string{}
	for _, t := range s.snapshotOnly {
		kept[t.TableName] = t.SnapshotOnly
	}
	for _, n := range published {
		switch why, snapshotOnly := kept[n]; {
		case snapshotOnly:
			s.cfg.Logger.Error("published table kept by snapshots only: its changes cannot be streamed, and the source refuses its application's UPDATEs and DELETEs while it is published without a replica identity; the reason says what makes it streamable, and it is streamed from then on",
				"table", n.String(), "publication", s.cfg.Publication, "reason", why)
		case !sel[n] && !s.waitsFor(n): // one waited for is logged at ERROR (overlap.Settle)
			s.cfg.Logger.Warn("published table not selected: its changes are skipped; name it in --tables to replicate it (it is then loaded first)",
				"table", n.String(), "publication", s.cfg.Publication)
		}
	}
	return nil
}

// withMatches returns names followed by the tables the session's patterns match that names lacks
// (cdc.CandidateTables, in name order): tables pgconverge can carry, streamed or kept by
// snapshots; with logSkips, each matching table it cannot carry is logged at WARN with the reason
// and the fix, and a pattern that matches nothing at WARN too. It reads the source on src.
func (s sessionStart) withMatches(ctx context.Context, src *pgx.Conn, names []changebatch.TableName, logSkips bool) ([]changebatch.TableName, error) {
	if len(s.patterns) == 0 {
		return names, nil
	}
	candidates, skipped, err := cdc.CandidateTables(ctx, src)
	if err != nil {
		return nil, err
	}
	// A partitioned table that an existing publication publishes under its partitions' names
	// cannot be followed as one table: it is skipped, not a reason to stop following the others.
	var viaRoot, pubExists bool
	err = src.QueryRow(ctx, `select pubviaroot from pg_publication where pubname = $1`, s.cfg.Publication).Scan(&viaRoot)
	if pubExists = err == nil; err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("look up publication %q: %w", s.cfg.Publication, err)
	}
	if pubExists && !viaRoot {
		parted, err := cdc.PartitionedTables(ctx, src)
		if err != nil {
			return nil, err
		}
		kept := candidates[:0:0]
		for _, n := range candidates {
			if parted[n] && !slices.Contains(names, n) {
				skipped = append(skipped, cdc.SkippedTable{Table: n, Reason: fmt.Sprintf("partitioned, and publication %q publishes partitions under their own names (publish_via_partition_root = false): ALTER PUBLICATION %s SET (publish_via_partition_root = true) follows it as one table (every table of the publication is loaded again)",
					s.cfg.Publication, pgx.Identifier{s.cfg.Publication}.Sanitize())})
				continue
			}
			kept = append(kept, n)
		}
		candidates = kept
	}
	out := slices.Clone(names)
	for _, p := range s.patterns {
		matched := false
		for _, n := range candidates {
			if p.Match(n) {
				matched = true
				if !slices.Contains(out, n) {
					out = append(out, n)
				}
			}
		}
		for _, sk := range skipped {
			if p.Match(sk.Table) && logSkips && !slices.Contains(names, sk.Table) {
				s.cfg.Logger.Warn("skipping table matched by a --tables pattern", "pattern", p.String(), "table", sk.Table.String(), "reason", sk.Reason)
			}
		}
		if !matched && logSkips {
			s.cfg.Logger.Warn("--tables pattern matches no table the daemon can follow yet: a table created later that matches it is followed then", "pattern", p.String())
		}
	}
	return out, nil
}
