package reconcile

import (
	"context"
	"fmt"
	"maps"
	"math/big"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// An incremental comparison (Config.Incremental) groups the rows by the low Memo.Bits bits of
// their key hash from the first level on, and remembers (Memo) the groups it found equal with, on
// each side, the group's row count and the xmin of the snapshot it read. The next comparison
// skips a group without hashing it when, on both sides, no row of the group has an xmin at or
// after the remembered snapshot's xmin and the group holds as many rows as remembered: every
// row visible now whose xmin precedes that xmin was committed before that snapshot was taken and
// visible in it (a row it did not see would have been inserted later, with a later xid), so the
// group's rows now are a subset of those then, and the same count makes them the same rows. A
// delete leaves no new xmin but lowers the count; an insert or update leaves a new xmin. A row's
// xmin is tested against the memo's by a look-up in the list of the xids assigned since (when
// few were) or by age() (side.changed).
// docs/verify.md, "Incremental verify", says when it falls back to hashing everything.

// Memo is what an incremental comparison found equal, for the next one (Stats.Memo).
type Memo struct {
	// Shape names the hashes and the relation compared; a memo of another shape is not used.
	Shape string
	// Bits is how many low bits of the key hash group the rows.
	Bits int
	// SourceXmin and TargetXmin are the xmin (64-bit, xid8) of the source's snapshot S and of the
	// target transaction's snapshot the groups were found equal at.
	SourceXmin, TargetXmin uint64
	// SourceRows and TargetTuples are the table's rows at S and its tuples on the target
	// (tombstones and rows newer than S included).
	SourceRows, TargetTuples int64
	// Groups are the groups that held rows on either side, by group id (key hash masked to
	// Bits); a group whose target rows had moved past S is not Equal.
	Groups map[int64]MemoGroup
}

// MemoGroup is one group: its rows at S and its tuples on the target, and whether it was found
// equal (with no target row newer than S).
type MemoGroup struct {
	SourceRows, TargetTuples int64
	Equal                    bool
}

// complete reports whether m's groups hold every row and tuple of the table.
func (m *Memo) complete() bool {
	var s, t int64
	for _, g := range m.Groups {
		s += g.SourceRows
		t += g.TargetTuples
	}
	return s == m.SourceRows && t == m.TargetTuples
}

// Incremental makes a comparison incremental.
type Incremental struct {
	// Previous is the memo of an earlier comparison of the table, nil for none: the comparison
	// then hashes every group (and so when Previous's shape differs, or its snapshots are too far
	// back in xids to be compared safely).
	Previous *Memo
	// Bits groups the rows of a comparison without a usable Previous (unless Whole), and of one
	// that refines a one-group memo; 0 chooses from the table's estimated rows (about 8192 rows
	// a group, at most 4096 groups).
	Bits int
	// Whole makes a comparison without a usable Previous compare the whole table as one group,
	// as fast as a comparison that is not incremental; its memo then has that one group, and the
	// first comparison that finds a change in it hashes the table by Bits' groups.
	Whole bool
	// XidList is how many xids a side may have assigned since Previous's snapshot for a row's
	// xmin to be looked up in their list rather than compared by age() (0: 10,000; negative:
	// always by age()).
	XidList int
}

// xidWindow is how far (in xids) a snapshot may be behind the current one for its xmin to be
// compared with the rows' 32-bit xmin: well inside the 2^31 that circular comparison allows.
const xidWindow = 1 << 30

// shape is what the memo of this comparison must match: the hash expressions and the relation.
func (c *comparison) shape() string {
	return c.cfg.Mode.String() + "\n" + c.keyH + "\n" + c.rowH + "\n" + c.cfg.Table.SourceRelation("t") + "\n" + c.cfg.Table.Quoted()
}

// side is one side's view of the memo's snapshot: its current snapshot's xmin, the age threshold
// under which a row's xmin is at or after the memo's (-1: the memo is unusable), and when few
// xids were assigned since, their list (an SQL array literal of xid, "" otherwise).
type side struct {
	xmin   uint64
	maxAge int64
	xids   string
}

// xidListMax is how many xids since the memo's snapshot a side may have assigned, by default,
// for the test of a row's xmin to be a look-up in their list (parallel safe, and cheaper than
// age()).
const xidListMax = 10000

// changed returns the SQL condition, on xmin column col, of a row whose xmin is at or after the
// memo's snapshot's xmin. Every row visible to the snapshot has an xmin below the snapshot's
// xmax, so the list of the xids from the memo's xmin to that xmax holds every such xmin; an xid
// of the list can only match a row older than the memo's snapshot when that row's raw xmin is
// 2^32 xids older (a row frozen long ago), which makes its group look changed: safe.
func (s side) changed(col string) string {
	if s.xids != "" {
		return col + " = any('" + s.xids + "'::xid[])"
	}
	return "age(" + col + ") <= " + strconv.FormatInt(s.maxAge, 10)
}

// readSide reads q's current snapshot and, for prev (the memo's xmin on that side, 0 for none),
// the age threshold: age(xmin) <= maxAge selects the rows whose xmin is at or after prev; and
// their list when there are at most list (negative: never).
func readSide(ctx context.Context, q Querier, prev uint64, list int) (side, error) {
	var xmin64, xmax64 int64
	var s side
	err := q.QueryRow(ctx, `select pg_snapshot_xmin(pg_current_snapshot())::text::int8, pg_snapshot_xmax(pg_current_snapshot())::text::int8`).Scan(&xmin64, &xmax64)
	if err != nil {
		return s, fmt.Errorf("read the snapshot's xids: %w", err)
	}
	xmin, xmax := uint64(xmin64), uint64(xmax64)
	s.xmin, s.maxAge = xmin, -1
	if prev == 0 || xmax < prev || xmax-prev >= xidWindow || prev%(1<<32) < 3 {
		return s, nil
	}
	// age(x) is (now - x) as a 32-bit signed difference from a fixed "now" of the transaction
	// at or after the snapshot's xmax (INT_MAX for the frozen and bootstrap xids): the next xid
	// when the transaction first calls age(), kept for the transaction. age(xid) is parallel
	// restricted, so a parallel worker (which would read a later "now") never evaluates it.
	var age int64
	if err := q.QueryRow(ctx, `select age($1::text::xid)`, strconv.FormatUint(prev%(1<<32), 10)).Scan(&age); err != nil {
		return s, fmt.Errorf("read the age of the remembered snapshot: %w", err)
	}
	if age >= int64(xmax-prev) && age < xidWindow {
		s.maxAge = age
	}
	if list >= 0 && xmax-prev <= uint64(list) {
		ids := make([]string, 0, xmax-prev)
		for x := prev; x < xmax; x++ {
			ids = append(ids, strconv.FormatUint(x%(1<<32), 10))
		}
		s.xids = "{" + strings.Join(ids, ",") + "}"
	}
	return s, nil
}

// tally is one group's counts in the xmin pass: rows (tuples on the target), those with an xmin
// at or after the memo's, and on the target those newer than S.
type tally struct{ rows, changed, newer int64 }

// runIncremental is run for a comparison with Config.Incremental.
func (c *comparison) runIncremental(ctx context.Context) error {
	inc := c.cfg.Incremental
	prev := inc.Previous
	if prev != nil && (prev.Shape != c.shape() || prev.Bits < 0 || prev.Bits > 16) {
		prev = nil
	}
	var ps, pt uint64
	if prev != nil {
		ps, pt = prev.SourceXmin, prev.TargetXmin
	}
	list := inc.XidList
	if list == 0 {
		list = xidListMax
	}
	var src, tgt side
	err := c.both(ctx, func(ctx context.Context) (err error) {
		src, err = readSide(ctx, c.src, ps, list)
		return err
	}, func(ctx context.Context) (err error) {
		tgt, err = readSide(ctx, c.tgt, pt, list)
		return err
	})
	if err != nil {
		return err
	}
	if prev != nil && (src.maxAge < 0 || tgt.maxAge < 0) {
		prev = nil
	}
	// The grouped queries cost more than JIT compilation's threshold and gain nothing from it:
	// compiling them takes longer than running them.
	err = c.both(ctx, func(ctx context.Context) error {
		return c.src.QueryRow(ctx, "select set_config('jit', 'off', true)").Scan(new(string))
	}, func(ctx context.Context) error {
		return c.tgt.QueryRow(ctx, "select set_config('jit', 'off', true)").Scan(new(string))
	})
	if err != nil {
		return err
	}
	next := &Memo{Shape: c.shape(), SourceXmin: src.xmin, TargetXmin: tgt.xmin, Groups: map[int64]MemoGroup{}}
	c.stats.Memo = next
	if prev == nil {
		if !inc.Whole {
			if next.Bits, err = c.groupBits(ctx); err != nil {
				return err
			}
		}
		return c.fullGroups(ctx, next)
	}
	next.Bits = prev.Bits
	c.stats.MemoUsed = true
	return c.incrementalGroups(ctx, prev, next, src, tgt)
}

// groupBits returns Incremental.Bits, or when 0 picks the grouping bits from the source's
// estimate of the table's rows.
func (c *comparison) groupBits(ctx context.Context) (int, error) {
	if b := c.cfg.Incremental.Bits; b > 0 {
		return min(b, 16), nil
	}
	var est float64
	if err := c.src.QueryRow(ctx, `select greatest(reltuples, 0)::float8 from pg_class where oid = $1::regclass`, c.cfg.Table.Quoted()).Scan(&est); err != nil {
		return 0, fmt.Errorf("read the estimated rows of %s: %w", c.cfg.Table, err)
	}
	return min(12, bits.Len64(uint64(est)/8192)), nil
}

// fullGroups hashes every group at next.Bits on both sides, remembers every group in next and
// narrows the mismatching ones down. At 0 bits, the whole table is one group, and no key is
// hashed.
func (c *comparison) fullGroups(ctx context.Context, next *Memo) error {
	all := allGroups(next.Bits)
	srcG, tgtG := map[int64]group{}, map[int64]group{}
	tgtT := map[int64]tally{}
	err := c.both(ctx, func(ctx context.Context) error {
		if next.Bits == 0 {
			q := "select 0::int8, count(*), sum(h)::text from (select " + c.rowH + " as h from " + c.cfg.Table.SourceRelation("t") + ") s having count(*) > 0"
			return c.scanGroups(ctx, c.src, q, srcG)
		}
		q := grouped("count(*), sum(h)::text", "select "+c.keyH+" as hk, "+c.rowH+" as h from "+c.cfg.Table.SourceRelation("t"), next.Bits, all)
		return c.scanGroups(ctx, c.src, q, srcG)
	}, func(ctx context.Context) error {
		aggs := "count(*) filter (where cur), coalesce(sum(h) filter (where cur), 0)::text, count(*), count(*) filter (where newer)"
		inner := "select " + c.keyH + " as hk, " + c.rowH + " as h, " + c.current + ` as cur, ("_cdc_lsn", "_cdc_seq") > ($1::pg_lsn, 0) as newer from ` + c.cfg.Table.Quoted()
		q := grouped(aggs, inner, next.Bits, all)
		if next.Bits == 0 {
			q = "select 0::int8, " + aggs + " from (select " + c.rowH + " as h, " + c.current + ` as cur, ("_cdc_lsn", "_cdc_seq") > ($1::pg_lsn, 0) as newer from ` +
				c.cfg.Table.Quoted() + ") s having count(*) > 0"
		}
		return c.scanTallies(ctx, c.tgt, q, tgtG, tgtT, c.cfg.Snapshot.String())
	})
	if err != nil {
		return err
	}
	srcT := map[int64]tally{}
	for id, g := range srcG {
		srcT[id] = tally{rows: g.rows}
	}
	return c.groupsCompared(ctx, next, srcT, tgtT, srcG, tgtG, nil)
}

// incrementalGroups skips the groups prev proves unchanged on both sides, hashes the others,
// remembers every group in next and narrows the mismatching ones down. With a complete memo it
// first counts the whole table's rows and changed rows (and the groups of the changed ones)
// without a key hash for the unchanged: nothing changed is the common case, and a few changes
// need only their groups hashed.
func (c *comparison) incrementalGroups(ctx context.Context, prev, next *Memo, src, tgt side) error {
	t := c.cfg.Table
	if prev.complete() {
		var s, g tally
		var sIDs, gIDs []int64
		err := c.both(ctx, func(ctx context.Context) error {
			return c.scanWhole(ctx, c.src, c.wholeSQL(t.SourceRelation("t"), src.changed("t.xmin"), prev.Bits), &s, &sIDs)
		}, func(ctx context.Context) error {
			return c.scanWhole(ctx, c.tgt, c.wholeSQL(t.Quoted(), tgt.changed("xmin"), prev.Bits), &g, &gIDs)
		})
		if err != nil {
			return err
		}
		c.stats.Groups++
		cand := map[int64]bool{}
		for id, mg := range prev.Groups {
			if !mg.Equal {
				cand[id] = true
			}
		}
		if s.changed == 0 && g.changed == 0 && len(cand) == 0 && s.rows == prev.SourceRows && g.rows == prev.TargetTuples {
			next.Groups, next.SourceRows, next.TargetTuples = prev.Groups, prev.SourceRows, prev.TargetTuples
			c.stats.SourceRows, c.stats.Compared = s.rows, s.rows
			c.stats.Skipped = int64(len(prev.Groups))
			return nil
		}
		if prev.Bits == 0 {
			// One group, changed: hash the table by groups, which the next comparison then skips
			// or hashes one by one.
			if next.Bits, err = c.groupBits(ctx); err != nil {
				return err
			}
			return c.fullGroups(ctx, next)
		}
		if (s.changed+g.changed)*8 > s.rows+g.rows {
			// Changes everywhere: hashing the groups they touch would hash about all.
			return c.fullGroups(ctx, next)
		}
		for _, id := range slices.Concat(sIDs, gIDs) {
			cand[id] = true
		}
		done, err := c.candidates(ctx, prev, next, cand, s.rows, g.rows)
		if done || err != nil {
			return err
		}
	}
	// Count every group's rows and changed rows on both sides.
	all := allGroups(prev.Bits)
	srcT, tgtT := map[int64]tally{}, map[int64]tally{}
	err := c.both(ctx, func(ctx context.Context) error {
		q := grouped("count(*), count(*) filter (where ch), 0", "select "+c.keyH+" as hk, "+src.changed("t.xmin")+" as ch from "+t.SourceRelation("t"), prev.Bits, all)
		return c.scanTallyGroups(ctx, c.src, q, srcT)
	}, func(ctx context.Context) error {
		q := grouped("count(*), count(*) filter (where ch), count(*) filter (where newer)", "select "+c.keyH+" as hk, "+tgt.changed("xmin")+` as ch, ("_cdc_lsn", "_cdc_seq") > ($1::pg_lsn, 0) as newer from `+t.Quoted(), prev.Bits, all)
		return c.scanTallyGroups(ctx, c.tgt, q, tgtT, c.cfg.Snapshot.String())
	})
	if err != nil {
		return err
	}
	var check []int64
	skipped := map[int64]bool{}
	for _, ids := range []map[int64]tally{srcT, tgtT} {
		for id := range ids {
			if _, seen := skipped[id]; seen {
				continue
			}
			p, ok := prev.Groups[id]
			s, g := srcT[id], tgtT[id]
			same := ok && p.Equal && s.rows == p.SourceRows && s.changed == 0 && g.rows == p.TargetTuples && g.changed == 0
			skipped[id] = same
			if !same {
				check = append(check, id)
			}
		}
	}
	srcG, tgtG := map[int64]group{}, map[int64]group{}
	if len(check) > 0 {
		slices.Sort(check)
		ids := groupList(check)
		if len(check) == len(skipped) {
			ids = all
		}
		err = c.both(ctx, func(ctx context.Context) error {
			q := grouped("count(*), sum(h)::text", "select "+c.keyH+" as hk, "+c.rowH+" as h from "+t.SourceRelation("t"), prev.Bits, ids)
			return c.scanGroups(ctx, c.src, q, srcG)
		}, func(ctx context.Context) error {
			q := grouped("count(*), sum(h)::text", "select "+c.keyH+" as hk, "+c.rowH+" as h from "+t.Quoted()+" where "+c.current, prev.Bits, ids)
			return c.scanGroups(ctx, c.tgt, q, tgtG, c.cfg.Snapshot.String())
		})
		if err != nil {
			return err
		}
	}
	return c.groupsCompared(ctx, next, srcT, tgtT, srcG, tgtG, skipped)
}

// candidates hashes the groups of cand (those with a row changed since prev on either side, and
// those prev did not find equal) with their counts, and checks that the other groups hold as many
// rows (tuples) as prev remembers: none of their rows is new, so each holds a subset of its rows
// then, and the totals (srcRows rows and tgtTuples tuples now) tell whether a delete took any. It
// returns false, having compared nothing, when one did: the groups must then be counted one by
// one.
func (c *comparison) candidates(ctx context.Context, prev, next *Memo, cand map[int64]bool, srcRows, tgtTuples int64) (bool, error) {
	t := c.cfg.Table
	ids := slices.Sorted(maps.Keys(cand))
	srcG, tgtG := map[int64]group{}, map[int64]group{}
	tgtT := map[int64]tally{}
	if len(ids) > 0 {
		err := c.both(ctx, func(ctx context.Context) error {
			q := grouped("count(*), sum(h)::text", "select "+c.keyH+" as hk, "+c.rowH+" as h from "+t.SourceRelation("t"), prev.Bits, groupList(ids))
			return c.scanGroups(ctx, c.src, q, srcG)
		}, func(ctx context.Context) error {
			q := grouped("count(*) filter (where cur), coalesce(sum(h) filter (where cur), 0)::text, count(*), count(*) filter (where newer)", "select "+
				c.keyH+" as hk, "+c.rowH+" as h, "+c.current+` as cur, ("_cdc_lsn", "_cdc_seq") > ($1::pg_lsn, 0) as newer from `+t.Quoted(), prev.Bits, groupList(ids))
			return c.scanTallies(ctx, c.tgt, q, tgtG, tgtT, c.cfg.Snapshot.String())
		})
		if err != nil {
			return false, err
		}
	}
	srcT := map[int64]tally{}
	for id, g := range srcG {
		srcT[id] = tally{rows: g.rows}
	}
	restSrc, restTgt := srcRows, tgtTuples
	for _, id := range ids {
		restSrc -= srcT[id].rows
		restTgt -= tgtT[id].rows
	}
	skipped := map[int64]bool{}
	for id, mg := range prev.Groups {
		if cand[id] {
			continue
		}
		restSrc -= mg.SourceRows
		restTgt -= mg.TargetTuples
		skipped[id] = true
		srcT[id], tgtT[id] = tally{rows: mg.SourceRows}, tally{rows: mg.TargetTuples}
	}
	if restSrc != 0 || restTgt != 0 {
		return false, nil
	}
	return true, c.groupsCompared(ctx, next, srcT, tgtT, srcG, tgtG, skipped)
}

// wholeSQL is the query of a relation's rows, those of them changed (condition ch) and the
// groups at bits of the latter: a bit string whose bit i (from the left) is set when group i has
// a changed row. The key hash is computed for the changed rows only, and bit_or, unlike
// array_agg in PostgreSQL 15, aggregates in parallel.
func (c *comparison) wholeSQL(rel, ch string, bits int) string {
	n := strconv.Itoa(1 << bits)
	return "select count(*), count(*) filter (where " + ch + "), coalesce(bit_or(case when " + ch + " then set_bit(repeat('0', " + n + ")::bit(" + n +
		"), (" + c.keyH + " & " + strconv.FormatInt(maskOf(bits), 10) + ")::int4, 1) end)::text, '') from " + rel
}

// scanWhole reads the one-row result of wholeSQL into t and ids.
func (c *comparison) scanWhole(ctx context.Context, q Querier, sql string, t *tally, ids *[]int64) error {
	var set string
	if err := q.QueryRow(ctx, sql).Scan(&t.rows, &t.changed, &set); err != nil {
		return err
	}
	c.count(0, int64(16+len(set)))
	for i, b := range set {
		if b == '1' {
			*ids = append(*ids, int64(i))
		}
	}
	return nil
}

// groupsCompared finishes a first level of groups: srcT and tgtT count every group's rows
// (tuples on the target) and those newer than S; srcG and tgtG are the checksums of the groups
// hashed, skipped the groups left out as unchanged (nil: none). It loads the keys moved past S,
// remembers every group in next (equal: skipped, or hashed equal with no target row newer than S)
// and narrows the mismatching ones down.
func (c *comparison) groupsCompared(ctx context.Context, next *Memo, srcT, tgtT map[int64]tally, srcG, tgtG map[int64]group, skipped map[int64]bool) error {
	var moved int64
	for _, s := range srcT {
		c.stats.SourceRows += s.rows
		next.SourceRows += s.rows
	}
	for _, g := range tgtT {
		moved += g.newer
		next.TargetTuples += g.rows
	}
	c.stats.Moved = moved
	if moved > 0 {
		if err := c.loadMoved(ctx); err != nil {
			return err
		}
	}
	c.stats.Compared = c.stats.SourceRows - int64(len(c.moved))
	srcG = c.subtractMoved(srcG, next.Bits)
	level := levelState{bits: next.Bits}
	total := max(c.stats.SourceRows, next.TargetTuples)
	ids := map[int64]bool{}
	for _, m := range []map[int64]tally{srcT, tgtT} {
		for id := range m {
			ids[id] = true
		}
	}
	for id := range ids {
		mg := MemoGroup{SourceRows: srcT[id].rows, TargetTuples: tgtT[id].rows}
		if skipped[id] {
			mg.Equal = true
			c.stats.Skipped++
			next.Groups[id] = mg
			continue
		}
		s, g := srcG[id], tgtG[id]
		if s.sum == nil {
			s.sum = new(big.Int)
		}
		if g.sum == nil {
			g.sum = new(big.Int)
		}
		c.stats.Groups++
		mg.Equal = s.equal(g) && tgtT[id].newer == 0
		next.Groups[id] = mg
		if !s.equal(g) {
			level.ids = append(level.ids, id)
			level.rows += max(s.rows, g.rows)
		}
	}
	if len(level.ids) == 0 {
		return nil
	}
	slices.Sort(level.ids)
	return c.narrow(ctx, level, total, true)
}

// grouped returns the query of aggs over the rows of inner (a select with the key hash as hk)
// per group (hk masked to bits) of the set ids (a set-returning SQL expression of int8 group
// ids), with the group id first. It joins the groups rather than grouping by the masked hash, so
// that the planner expects few groups (it cannot tell that a masked hash has few values, and would
// sort every row) and hashes, in parallel where it may.
func grouped(aggs, inner string, bits int, ids string) string {
	return "select g.i, " + aggs + " from (" + inner + ") s join " + ids + " g(i) on g.i = (s.hk & " + strconv.FormatInt(maskOf(bits), 10) + ") group by 1"
}

// allGroups is the set of every group id at bits, for grouped.
func allGroups(bits int) string {
	return "generate_series(0::int8, " + strconv.FormatInt(maskOf(bits), 10) + "::int8)"
}

// groupList is the set of the group ids, for grouped.
func groupList(ids []int64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatInt(id, 10)
	}
	return "unnest('{" + strings.Join(parts, ",") + "}'::int8[])"
}

// scanTally reads the one-row result (rows, changed, newer) of sql into t.
func (c *comparison) scanTally(ctx context.Context, q Querier, sql string, t *tally, args ...any) error {
	if err := q.QueryRow(ctx, sql, args...).Scan(&t.rows, &t.changed, &t.newer); err != nil {
		return err
	}
	c.count(0, 24)
	return nil
}

// scanTallyGroups reads rows (group id, rows, changed, newer) of sql into ts.
func (c *comparison) scanTallyGroups(ctx context.Context, q Querier, sql string, ts map[int64]tally, args ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var t tally
		if err := rows.Scan(&id, &t.rows, &t.changed, &t.newer); err != nil {
			return err
		}
		c.count(0, 32)
		ts[id] = t
	}
	return rows.Err()
}

// scanTallies reads rows (group id, current rows, their sum as text, tuples, newer) of sql into
// gs and ts.
func (c *comparison) scanTallies(ctx context.Context, q Querier, sql string, gs map[int64]group, ts map[int64]tally, args ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, n int64
		var sum string
		var t tally
		if err := rows.Scan(&id, &n, &sum, &t.rows, &t.newer); err != nil {
			return err
		}
		c.count(0, int64(32+len(sum)))
		s, ok := new(big.Int).SetString(sum, 10)
		if !ok {
			return fmt.Errorf("checksum %q is not a number", sum)
		}
		if n > 0 {
			gs[id] = group{rows: n, sum: s}
		}
		ts[id] = t
	}
	return rows.Err()
}
