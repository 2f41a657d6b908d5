package reconcile

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"golang.org/x/sync/errgroup"
)

// Config is one table's comparison.
type Config struct {
	// Table is the source's description of the table; the target table has its columns.
	Table changebatch.Table
	// Snapshot is S, the LSN of the source's exact snapshot: target rows at a version above
	// (S, 0) are not compared.
	Snapshot pglogrepl.LSN
	// Mode is how values are hashed (Probe).
	Mode HashMode
	// LeafRows: once the mismatching groups hold at most this many rows, their rows are fetched
	// and compared (default 4096).
	LeafRows int
	// MaxGroups bounds the groups one level asks each side for (default 65536).
	MaxGroups int
	// MaxDiffs, when above 0, stops the comparison with ErrTooManyDiffs once the first level of
	// groups shows that more keys than it likely differ: for a caller that would rather do
	// something else than handle that many differences. Keys fall into groups by a hash, so
	// differing keys spread over the groups at random: when a share f of the level's G groups
	// differ, about −G·ln(1−f) keys do (the expected number of occupied bins, inverted).
	MaxDiffs int64
	// Emit receives the differences as they are found, in batches; the slice is the caller's.
	Emit func(ctx context.Context, diffs []Diff) error
	// Incremental, when not nil, makes the comparison group the rows from the first level on,
	// skip the groups Incremental.Previous proves unchanged on both sides, and return what it
	// found equal in Stats.Memo (incremental.go). A keyless table, a partitioned one or one
	// published with a row filter is compared in full, as without it.
	Incremental *Incremental
	// Pace, when set, is called after each of the comparison's queries on the source with the
	// rows it counts as read, the table's source rows (a checksum query scans the table), and the
	// bytes fetched since the last call; its error ends the comparison (a rate limit's wait,
	// pacing.Pacer.Take, ended by ctx).
	Pace func(ctx context.Context, rows, bytes int64) error
}

// ErrTooManyDiffs is wrapped by Compare's error when a level of groups proved more differing
// keys than Config.MaxDiffs.
var ErrTooManyDiffs = errors.New("more keys differ than the comparison may handle")

// Kind is the kind of a difference.
type Kind string

// The kinds of differences (docs/design.md, "Reconciliation").
const (
	// Missing: the source has the row at S; the target has no live row (absent, or a tombstone).
	Missing Kind = "missing"
	// Extra: the target has a live row the source does not have at S.
	Extra Kind = "extra"
	// Different: both have a live row, and their values differ.
	Different Kind = "different"
)

// Diff is one key whose target row disagrees with the source at S.
type Diff struct {
	Kind Kind
	// Key holds the key's values as text, in the key's index order (Table.KeyOrder).
	Key []string
	// SourceHash and TargetHash are the rows' 64-bit hashes (16 hex digits); "" where that side
	// has no live row.
	SourceHash, TargetHash string
	// TargetVersion is the target row's version, zero when the target has no row for the key;
	// TargetDeleted is true when that row is a tombstone.
	TargetVersion changebatch.Version
	TargetDeleted bool
}

// Stats is what a comparison did.
type Stats struct {
	// SourceRows is the rows the snapshot shows, Compared those compared (all but the keys the
	// target has moved past S), Moved the target rows (live or tombstones) newer than (S, 0).
	SourceRows, Compared, Moved int64
	// Groups is the number of checksum groups compared (each level's), Levels the levels of
	// grouping the mismatches needed (0: the whole-table checksums matched).
	Groups int64
	Levels int
	// RowsFetched and BytesFetched count what was read from both sides: rows (keys with their
	// hashes) and the bytes of every result, checksums included.
	RowsFetched, BytesFetched int64
	// Found counts the differences by kind.
	Found map[Kind]int64
	// Skipped counts the groups an incremental comparison left out as unchanged on both sides
	// since the memo's snapshots; Memo is what it found equal, for the next one (nil for a
	// comparison that was not incremental).
	Skipped int64
	Memo    *Memo
	// MemoUsed is true when the comparison built on Incremental.Previous (false: it hashed
	// every group, Previous being nil, of another shape or too far back in xids).
	MemoUsed bool
}

// group is one group's checksum on one side: rows and the sum of their row hashes.
type group struct {
	rows int64
	sum  *big.Int
}

// pair is a key hash with its row hash: a source row of a key the target moved past S.
type pair struct{ key, row int64 }

// comparison is the state of one Compare.
type comparison struct {
	cfg        Config
	src, tgt   Querier
	rowH, keyH string
	// current is the target's filter for the rows compared (current, or keylessCurrent).
	current string
	moved   []pair // source rows of keys the target moved past S
	// movedValues are a keyless table's values the target moved past S (loadMovedValues).
	movedValues map[[2]int64]bool
	stats       Stats
	// rows and bytes fetched, from both sides' goroutines at once
	rows, bytes atomic.Int64
	// paced is c.bytes when Pace was last called.
	paced int64
}

// Compare compares cfg.Table between src (a transaction at the exact snapshot S) and tgt (a
// REPEATABLE READ transaction on the target), emitting every difference, and returns what it did.
func Compare(ctx context.Context, src, tgt Querier, cfg Config) (Stats, error) {
	if cfg.LeafRows <= 0 {
		cfg.LeafRows = 4096
	}
	if cfg.MaxGroups <= 0 {
		cfg.MaxGroups = 65536
	}
	c := &comparison{cfg: cfg, src: src, tgt: tgt,
		rowH: rowHash(cfg.Mode, cfg.Table, ""), keyH: keyHash(cfg.Mode, cfg.Table, ""), current: current}
	if cfg.Table.Keyless {
		c.keyH, c.current = valueGroupHash(cfg.Mode, cfg.Table), keylessCurrent
	}
	c.stats.Found = map[Kind]int64{}
	run := c.run
	if cfg.Incremental != nil && incrementable(cfg.Table) {
		run = c.runIncremental
	}
	err := run(ctx)
	c.stats.RowsFetched, c.stats.BytesFetched = c.rows.Load(), c.bytes.Load()
	return c.stats, err
}

// current is the target's filter for the rows compared: live, at a version at or below (S, 0).
const current = `(` + `"_cdc_lsn", "_cdc_seq") <= ($1::pg_lsn, 0) and not "_cdc_deleted"`

func (c *comparison) run(ctx context.Context) error {
	var srcAll, tgtAll group
	var moved int64
	err := c.both(ctx, func(ctx context.Context) error {
		return c.scanOne(ctx, c.src, "select count(*), coalesce(sum(h), 0)::text from (select "+c.rowH+" as h from "+c.cfg.Table.SourceRelation("t")+") s", &srcAll, nil)
	}, func(ctx context.Context) error {
		newer := `("_cdc_lsn", "_cdc_seq") > ($1::pg_lsn, 0)`
		if c.cfg.Table.Keyless {
			newer = "false" // a keyless table's entries show its state at S exactly (keylessCurrent)
		}
		q := "select count(*) filter (where cur), coalesce(sum(h) filter (where cur), 0)::text, count(*) filter (where not cur and newer) from (select " +
			c.rowH + " as h, " + c.current + " as cur, " + newer + " as newer from " + c.cfg.Table.Quoted() + ") s"
		return c.scanOne(ctx, c.tgt, q, &tgtAll, &moved, c.cfg.Snapshot.String())
	})
	if err != nil {
		return err
	}
	c.stats.Groups++
	c.stats.SourceRows, c.stats.Moved = srcAll.rows, moved
	if err := c.pace(ctx); err != nil { // the first scan, once its rows are known
		return err
	}
	if moved > 0 {
		if err := c.loadMoved(ctx); err != nil {
			return err
		}
	}
	if c.cfg.Table.Keyless {
		if err := c.loadMovedValues(ctx, &tgtAll); err != nil {
			return err
		}
	}
	c.stats.Compared = srcAll.rows - int64(len(c.moved))
	srcAll = c.subtractMoved(map[int64]group{0: srcAll}, 0)[0]
	if srcAll.equal(tgtAll) {
		return nil
	}
	level := levelState{bits: 0, ids: []int64{0}, rows: max(srcAll.rows, tgtAll.rows)}
	return c.narrow(ctx, level, level.rows, false)
}

// incrementable reports whether t can be compared incrementally: a plain table with a key,
// published without a row filter (the xmin pass reads the table's own tuples).
func incrementable(t changebatch.Table) bool {
	return !t.Keyless && !t.Partitioned && t.RowFilter == ""
}

// narrow narrows the mismatching groups of level down, level by level, to the rows it then
// fetches and compares; total is the larger side's rows in the table. With split, level is the
// first level of groups (an incremental comparison's), split at least once before its share of
// the rows decides.
func (c *comparison) narrow(ctx context.Context, level levelState, total int64, split bool) error {
	for {
		// Fetch the rows once few are left, or when grouping did not narrow them down (the
		// differences are everywhere): another level would scan as much and fetch as much.
		if level.rows <= int64(c.cfg.LeafRows) || level.bits >= 62 || (level.bits > 0 && !split && level.rows > total/4) {
			if c.cfg.Table.Keyless {
				return c.leafKeyless(ctx, level)
			}
			return c.leaf(ctx, level)
		}
		c.stats.Levels++
		split = false
		next, err := c.split(ctx, level)
		if err != nil {
			return err
		}
		if len(next.ids) == 0 {
			return nil // the differences cancelled out between groups: none at key level
		}
		if c.cfg.MaxDiffs > 0 && level.bits == 0 {
			groups := float64(uint64(1) << next.bits)
			est := -groups * math.Log1p(-float64(len(next.ids))/groups)
			if est > float64(c.cfg.MaxDiffs) {
				return fmt.Errorf("%w: %d of %.0f groups of %s differ, about %.0f keys, more than %d", ErrTooManyDiffs, len(next.ids), groups, c.cfg.Table, est, c.cfg.MaxDiffs)
			}
		}
		level = next
	}
}

// levelState is the mismatching groups of one level: ids are key-hash values masked to bits.
type levelState struct {
	bits int
	ids  []int64
	rows int64 // the rows they hold, the larger side's
}

// filter returns the SQL condition that keeps the rows in l's groups, on the key hash hk.
func (l levelState) filter() string {
	if l.bits == 0 {
		return "true"
	}
	ids := make([]string, len(l.ids))
	for i, id := range l.ids {
		ids[i] = strconv.FormatInt(id, 10)
	}
	return "(hk & " + strconv.FormatInt(maskOf(l.bits), 10) + ") = any('{" + strings.Join(ids, ",") + "}'::int8[])"
}

func maskOf(bits int) int64 { return int64(uint64(1)<<bits - 1) }

// split groups the rows of l's groups by more bits of the key hash on both sides and returns the
// groups that still differ.
func (c *comparison) split(ctx context.Context, l levelState) (levelState, error) {
	per := l.rows / int64(len(l.ids))
	k := max(1, bits.Len64(uint64(per/8)))
	for k > 1 && len(l.ids)<<k > c.cfg.MaxGroups {
		k--
	}
	k = min(k, 62-l.bits)
	next := levelState{bits: l.bits + k}
	m := strconv.FormatInt(maskOf(next.bits), 10)
	srcG, tgtG := map[int64]group{}, map[int64]group{}
	err := c.both(ctx, func(ctx context.Context) error {
		q := "select hk & " + m + ", count(*), sum(h)::text from (select " + c.keyH + " as hk, " + c.rowH + " as h from " + c.cfg.Table.SourceRelation("t") + ") s where " + l.filter() + " group by 1"
		return c.scanGroups(ctx, c.src, q, srcG)
	}, func(ctx context.Context) error {
		q := "select hk & " + m + ", count(*), sum(h)::text from (select " + c.keyH + " as hk, " + c.rowH + " as h from " + c.cfg.Table.Quoted() + " where " + c.current + ") s where " + l.filter() + " group by 1"
		return c.scanGroups(ctx, c.tgt, q, tgtG, c.cfg.Snapshot.String())
	})
	if err != nil {
		return next, err
	}
	srcG = c.subtractMoved(srcG, next.bits)
	for id, s := range srcG {
		c.stats.Groups++
		if t, ok := tgtG[id]; !ok || !s.equal(t) {
			next.ids = append(next.ids, id)
			next.rows += max(s.rows, tgtG[id].rows)
		}
	}
	for id, t := range tgtG {
		if _, ok := srcG[id]; !ok {
			c.stats.Groups++
			next.ids = append(next.ids, id)
			next.rows += t.rows
		}
	}
	return next, nil
}

// subtractMoved takes the source rows of keys the target moved past S out of the source's groups
// at bits (keyed by key hash masked to bits).
func (c *comparison) subtractMoved(gs map[int64]group, bits int) map[int64]group {
	for _, p := range c.moved {
		id := p.key & maskOf(bits)
		g, ok := gs[id]
		if !ok {
			continue // the group is not in this level
		}
		g.rows--
		g.sum = new(big.Int).Sub(g.sum, big.NewInt(p.row))
		if g.rows == 0 {
			delete(gs, id)
		} else {
			gs[id] = g
		}
	}
	return gs
}

func (g group) equal(o group) bool {
	return g.rows == o.rows && (g.rows == 0 || g.sum.Cmp(o.sum) == 0)
}

// both runs the source's and the target's query at once.
func (c *comparison) both(ctx context.Context, src, tgt func(context.Context) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := src(gctx); err != nil {
			return fmt.Errorf("checksum %s on the source: %w", c.cfg.Table, err)
		}
		return nil
	})
	g.Go(func() error {
		if err := tgt(gctx); err != nil {
			return fmt.Errorf("checksum %s on the target: %w", c.cfg.Table, err)
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return err
	}
	return c.pace(ctx)
}

// pace calls Config.Pace, when set, with the table's source rows known so far (0 before the
// first scan) and the bytes fetched since the last call.
func (c *comparison) pace(ctx context.Context) error {
	if c.cfg.Pace == nil {
		return nil
	}
	b := c.bytes.Load()
	defer func() { c.paced = b }()
	return c.cfg.Pace(ctx, c.stats.SourceRows, b-c.paced)
}

// scanOne reads the one-row result (count, sum as text[, moved]) of q into g (and moved).
func (c *comparison) scanOne(ctx context.Context, q Querier, sql string, g *group, moved *int64, args ...any) error {
	var sum string
	dest := []any{&g.rows, &sum}
	if moved != nil {
		dest = append(dest, moved)
	}
	if err := q.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		return err
	}
	c.count(0, int64(len(sum)+8*len(dest)))
	var ok bool
	if g.sum, ok = new(big.Int).SetString(sum, 10); !ok {
		return fmt.Errorf("checksum %q is not a number", sum)
	}
	return nil
}

// scanGroups reads rows (group id, count, sum as text) of sql into gs.
func (c *comparison) scanGroups(ctx context.Context, q Querier, sql string, gs map[int64]group, args ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var bytes int64
	for rows.Next() {
		var id, n int64
		var sum string
		if err := rows.Scan(&id, &n, &sum); err != nil {
			return err
		}
		for _, r := range rows.RawValues() {
			bytes += int64(len(r))
		}
		s, ok := new(big.Int).SetString(sum, 10)
		if !ok {
			return fmt.Errorf("checksum %q is not a number", sum)
		}
		gs[id] = group{rows: n, sum: s}
	}
	err = rows.Err()
	c.count(0, bytes)
	return err
}

// count adds to the fetched rows and bytes.
func (c *comparison) count(rows, bytes int64) {
	c.rows.Add(rows)
	c.bytes.Add(bytes)
}
