package reconcile

import (
	"context"
	"errors"
	"math/big"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// tabKV is s.t (k bigint key, v text), the table of the SQL golden tests.
var tabKV = changebatch.Table{TableName: changebatch.TableName{Schema: "s", Name: "t"}, Columns: []changebatch.Column{
	{Name: "k", Type: "bigint", TypeOID: oidInt8, Key: true, KeyPos: 1}, {Name: "v", Type: "text", TypeOID: oidText}}}

func TestMaskAndFilter(t *testing.T) {
	for _, c := range []struct {
		bits int
		mask int64
	}{{0, 0}, {1, 1}, {3, 7}, {62, 1<<62 - 1}} {
		if got := maskOf(c.bits); got != c.mask {
			t.Errorf("maskOf(%d) = %d, want %d", c.bits, got, c.mask)
		}
	}
	for _, c := range []struct {
		l    levelState
		want string
	}{
		{levelState{bits: 0, ids: []int64{0}}, "true"},
		{levelState{bits: 3, ids: []int64{1, 5}}, `(hk & 7) = any('{1,5}'::int8[])`},
		{levelState{bits: 1, ids: []int64{0}}, `(hk & 1) = any('{0}'::int8[])`},
	} {
		if got := c.l.filter(); got != c.want {
			t.Errorf("filter(%+v) = %s, want %s", c.l, got, c.want)
		}
	}
}

func grp(rows, sum int64) group { return group{rows: rows, sum: big.NewInt(sum)} }

// Two groups match when they hold as many rows with the same sum of row hashes; empty groups
// match whatever their (absent) sums.
func TestGroupEqual(t *testing.T) {
	for _, c := range []struct {
		a, b group
		want bool
	}{
		{grp(2, 10), grp(2, 10), true},
		{grp(2, 10), grp(2, 11), false},
		{grp(2, 10), grp(3, 10), false},
		{group{}, grp(0, 5), true},
		{grp(1, -1), grp(1, -1), true},
	} {
		if got := c.a.equal(c.b); got != c.want {
			t.Errorf("%v equal %v = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// The source rows of keys the target moved past S come out of the groups their key hash falls in
// at each level; a group left empty disappears; groups not in the level are untouched.
func TestSubtractMoved(t *testing.T) {
	c := &comparison{moved: []pair{{key: 0b101, row: 7}, {key: 0b111, row: 3}, {key: 0b110, row: 4}}}
	got := c.subtractMoved(map[int64]group{0: grp(10, 100)}, 0)
	if want := (map[int64]group{0: grp(7, 86)}); !groupsEqual(got, want) {
		t.Errorf("level 0: %v, want %v", got, want)
	}
	got = c.subtractMoved(map[int64]group{0b01: grp(2, 10), 0b11: grp(1, 3), 0b00: grp(5, 5)}, 2)
	if want := (map[int64]group{0b01: grp(1, 3), 0b00: grp(5, 5)}); !groupsEqual(got, want) {
		t.Errorf("level 2: %v, want %v (group 0b10 is not in the level)", got, want)
	}
}

func groupsEqual(a, b map[int64]group) bool {
	if len(a) != len(b) {
		return false
	}
	for id, g := range a {
		if o, ok := b[id]; !ok || g.rows != o.rows || g.sum.Cmp(o.sum) != 0 {
			return false
		}
	}
	return true
}

func TestHashHexAndRowOrder(t *testing.T) {
	for v, want := range map[int64]string{0: "0000000000000000", 255: "00000000000000ff", -1: "ffffffffffffffff", -2: "fffffffffffffffe"} {
		if got := hashHex(v); got != want {
			t.Errorf("hashHex(%d) = %s, want %s", v, got, want)
		}
	}
	// Rows order by key hash (signed, as int8 sorts), then by the key's texts in byte order.
	rows := []*leafRow{{hk: 5, key: []string{"b"}}, {hk: -3, key: []string{"z"}}, {hk: 5, key: []string{"B"}}, {hk: 5, key: []string{"b", "a"}}, nil}
	slices.SortFunc(rows, cmpNil)
	var got []string
	for _, r := range rows {
		if r == nil {
			got = append(got, "<end>")
			continue
		}
		got = append(got, hashHex(r.hk)[15:]+":"+r.key[len(r.key)-1])
	}
	if want := []string{"d:z", "5:B", "5:b", "5:a", "<end>"}; !slices.Equal(got, want) {
		t.Errorf("order = %v, want %v", got, want)
	}
}

// merge classifies each key of the two ordered leaf streams. S is 0/1000: target rows above
// (S, 0) have moved on and are never compared, on either side.
func TestMerge(t *testing.T) {
	S := pglogrepl.LSN(0x1000)
	at := func(lsn pglogrepl.LSN, seq uint64) changebatch.Version {
		return changebatch.Version{LSN: lsn, Seq: seq}
	}
	src := []*leafRow{
		{hk: 1, h: 10, key: []string{"same"}},
		{hk: 2, h: 20, key: []string{"missing"}},
		{hk: 3, h: 30, key: []string{"different"}},
		{hk: 4, h: 40, key: []string{"tombstoned"}},
		{hk: 5, h: 50, key: []string{"moved"}},
		{hk: 6, h: 60, key: []string{"at S"}},
	}
	tgt := []*leafRow{
		{hk: 1, h: 10, key: []string{"same"}, version: at(0x900, 1)},
		{hk: 3, h: 31, key: []string{"different"}, version: at(0x900, 2)},
		{hk: 4, h: 40, key: []string{"tombstoned"}, version: at(0x950, 1), deleted: true},
		{hk: 5, h: 51, key: []string{"moved"}, version: at(S, 1)},
		{hk: 6, h: 61, key: []string{"at S"}, version: at(S, 0)},
		{hk: 7, h: 70, key: []string{"extra"}, version: at(0x800, 1)},
		{hk: 8, h: 80, key: []string{"extra tombstone"}, version: at(0x800, 1), deleted: true},
		{hk: 9, h: 90, key: []string{"new after S"}, version: at(0x2000, 1)},
	}
	want := []Diff{
		{Kind: Missing, Key: []string{"missing"}, SourceHash: hashHex(20)},
		{Kind: Different, Key: []string{"different"}, SourceHash: hashHex(30), TargetHash: hashHex(31), TargetVersion: at(0x900, 2)},
		{Kind: Missing, Key: []string{"tombstoned"}, SourceHash: hashHex(40), TargetVersion: at(0x950, 1), TargetDeleted: true},
		{Kind: Different, Key: []string{"at S"}, SourceHash: hashHex(60), TargetHash: hashHex(61), TargetVersion: at(S, 0)},
		{Kind: Extra, Key: []string{"extra"}, TargetHash: hashHex(70), TargetVersion: at(0x800, 1)},
	}
	for run := range 2 { // a pure function of the rows: the same differences every time
		got, stats := runMerge(t, S, src, tgt)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("run %d: diffs\n%+v\nwant\n%+v", run, got, want)
		}
		if wantFound := (map[Kind]int64{Missing: 2, Different: 2, Extra: 1}); !reflect.DeepEqual(stats.Found, wantFound) {
			t.Errorf("found %v, want %v", stats.Found, wantFound)
		}
	}
}

// runMerge merges src and tgt (in order) and returns what was emitted.
func runMerge(t *testing.T, snap pglogrepl.LSN, src, tgt []*leafRow) ([]Diff, Stats) {
	t.Helper()
	var got []Diff
	c := &comparison{cfg: Config{Snapshot: snap, Emit: func(_ context.Context, d []Diff) error {
		got = append(got, d...)
		return nil
	}}, stats: Stats{Found: map[Kind]int64{}}}
	feed := func(rows []*leafRow) chan *leafRow {
		ch := make(chan *leafRow, len(rows))
		for _, r := range rows {
			ch <- r
		}
		close(ch)
		return ch
	}
	if err := c.merge(t.Context(), feed(src), feed(tgt)); err != nil {
		t.Fatal(err)
	}
	return got, c.stats
}

// Differences reach Emit in batches of emitBatch; an error from Emit ends the merge.
func TestMergeEmitsInBatches(t *testing.T) {
	var src []*leafRow
	for i := range emitBatch + 5 {
		src = append(src, &leafRow{hk: int64(i), key: []string{"k"}})
	}
	var sizes []int
	c := &comparison{cfg: Config{Emit: func(_ context.Context, d []Diff) error {
		sizes = append(sizes, len(d))
		return nil
	}}, stats: Stats{Found: map[Kind]int64{}}}
	ch := make(chan *leafRow, len(src))
	for _, r := range src {
		ch <- r
	}
	close(ch)
	empty := make(chan *leafRow)
	close(empty)
	if err := c.merge(t.Context(), ch, empty); err != nil || !slices.Equal(sizes, []int{emitBatch, 5}) {
		t.Errorf("merge: %v, batches %v, want [%d 5]", err, sizes, emitBatch)
	}
	boom := errors.New("boom")
	c.cfg.Emit = func(context.Context, []Diff) error { return boom }
	ch = make(chan *leafRow, 1)
	ch <- &leafRow{key: []string{"k"}}
	close(ch)
	empty = make(chan *leafRow)
	close(empty)
	if err := c.merge(t.Context(), ch, empty); !errors.Is(err, boom) {
		t.Errorf("merge with a failing Emit = %v, want boom", err)
	}
}

func TestHashModeAndKeyTexts(t *testing.T) {
	if TypeHash.String() != "type-hash" || MD5.String() != "md5" {
		t.Errorf("mode names %s %s", TypeHash, MD5)
	}
	two := changebatch.Table{TableName: tabKV.TableName, Columns: []changebatch.Column{
		{Name: "a", Key: true, KeyPos: 2}, {Name: "B c", Key: true, KeyPos: 1}, {Name: "v"}}}
	if got, want := keyTexts(two), []string{`"B c"::text`, `"a"::text`}; !slices.Equal(got, want) {
		t.Errorf("keyTexts = %v, want %v (in key index order)", got, want)
	}
}

// recorder is a Querier that records the SQL it is given and fails every query, so that the SQL
// a comparison step builds can be compared to a golden string without a database.
type recorder struct {
	mu   sync.Mutex
	sqls []string
}

var errRecorded = errors.New("recorded")

func (r *recorder) add(sql string) {
	r.mu.Lock()
	r.sqls = append(r.sqls, sql)
	r.mu.Unlock()
}

func (r *recorder) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	r.add(sql)
	return nil, errRecorded
}

func (r *recorder) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	r.add(sql)
	return failedRow{}
}

type failedRow struct{}

func (failedRow) Scan(...any) error { return errRecorded }
