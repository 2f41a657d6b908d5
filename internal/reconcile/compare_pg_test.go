package reconcile

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// Comparisons against the test clusters (scripts/test.sh): the source holds s.t (k bigint key, v
// text) and the target the same rows with their versions, as apply writes them; S is 0/1000.

const pgSnapshot = pglogrepl.LSN(0x1000)

// kvTable creates s.t with rows 1..n on both sides, at version (0/900, 1) on the target.
func kvTable(t *testing.T, env *pgtest.Env, n int) {
	t.Helper()
	pgtest.Exec(t, env.Source, `create schema s`, `create table s.t (k bigint primary key, v text)`,
		fmt.Sprintf(`insert into s.t select k, 'v' || k from generate_series(1, %d) k`, n))
	pgtest.Exec(t, env.Target, `create schema s`,
		`create table s.t (k bigint primary key, v text, _cdc_lsn pg_lsn not null, _cdc_seq bigint not null, _cdc_deleted bool not null default false)`,
		fmt.Sprintf(`insert into s.t select k, 'v' || k, '0/900', 1 from generate_series(1, %d) k`, n))
}

// compareKV compares s.t and returns the differences, ordered by key.
func compareKV(t *testing.T, env *pgtest.Env, mode HashMode, leafRows int) ([]Diff, Stats) {
	t.Helper()
	var diffs []Diff
	st, err := Compare(t.Context(), env.Source, env.Target, Config{Table: tabKV, Snapshot: pgSnapshot, Mode: mode, LeafRows: leafRows,
		Emit: func(_ context.Context, d []Diff) error {
			diffs = append(diffs, d...)
			return nil
		}})
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	slices.SortFunc(diffs, func(a, b Diff) int {
		return strings.Compare(fmt.Sprintf("%08s", a.Key[0]), fmt.Sprintf("%08s", b.Key[0]))
	})
	return diffs, st
}

func TestCompareEqualTables(t *testing.T) {
	env := pgtest.New(t)
	if mode, err := Probe(t.Context(), env.Source, env.Target); err != nil || mode != TypeHash {
		t.Errorf("Probe = %s, %v, want type-hash between two servers of one machine", mode, err)
	}
	kvTable(t, env, 500)
	for _, mode := range []HashMode{TypeHash, MD5} {
		diffs, st := compareKV(t, env, mode, 8)
		if len(diffs) != 0 || st.Levels != 0 || st.Groups != 1 || st.SourceRows != 500 || st.Compared != 500 || st.Moved != 0 {
			t.Errorf("%s: diffs %v, stats %+v, want none from the whole-table checksums alone", mode, diffs, st)
		}
	}
	// A key the target moved past S leaves the comparison on both sides: the whole-table
	// checksums still match, with only that key and its source row read.
	pgtest.Exec(t, env.Target, `update s.t set v = 'moved', _cdc_lsn = '0/2000' where k = 7`)
	for _, mode := range []HashMode{TypeHash, MD5} {
		diffs, st := compareKV(t, env, mode, 8)
		if len(diffs) != 0 || st.Levels != 0 || st.Groups != 1 || st.Compared != 499 || st.Moved != 1 || st.RowsFetched != 2 {
			t.Errorf("%s, a key moved past S: diffs %v, stats %+v", mode, diffs, st)
		}
	}
}

// Every kind of difference is found, by the whole-table leaf and by narrowing alike, with either
// hash mode; target rows newer than S are compared on neither side; a repeated run finds exactly
// the same differences (they are a function of the rows only).
func TestCompareFindsEveryDifference(t *testing.T) {
	env := pgtest.New(t)
	kvTable(t, env, 2000)
	pgtest.Exec(t, env.Target,
		`delete from s.t where k = 10`,                                        // missing
		`update s.t set _cdc_deleted = true, _cdc_lsn = '0/950' where k = 20`, // missing: a tombstone
		`update s.t set v = 'changed', _cdc_lsn = '0/960' where k = 30`,       // different
		`insert into s.t values (5000, 'extra', '0/970', 1, false)`,           // extra
		`insert into s.t values (5001, 'gone', '0/970', 1, true)`,             // a tombstone the source lacks too: no difference
		`update s.t set v = 'moved', _cdc_lsn = '0/2000' where k = 40`,        // past S: not compared
		`insert into s.t values (6000, 'new', '0/3000', 1, false)`,            // past S: not extra
	)
	pgtest.Exec(t, env.Source, `update s.t set v = 'source changed' where k = 50`) // different
	at := func(lsn pglogrepl.LSN) changebatch.Version { return changebatch.Version{LSN: lsn, Seq: 1} }
	want := []struct {
		kind    Kind
		key     string
		version changebatch.Version
		deleted bool
	}{{Missing, "10", changebatch.Version{}, false}, {Missing, "20", at(0x950), true}, {Different, "30", at(0x960), false},
		{Different, "50", at(0x900), false}, {Extra, "5000", at(0x970), false}}
	for _, mode := range []HashMode{TypeHash, MD5} {
		var first []Diff
		for _, leafRows := range []int{4096, 64, 8} {
			diffs, st := compareKV(t, env, mode, leafRows)
			name := fmt.Sprintf("%s, leaf rows %d", mode, leafRows)
			ok := len(diffs) == len(want)
			for i := 0; ok && i < len(want); i++ {
				d, w := diffs[i], want[i]
				ok = d.Kind == w.kind && slices.Equal(d.Key, []string{w.key}) && d.TargetVersion == w.version && d.TargetDeleted == w.deleted &&
					(d.SourceHash == "") == (w.kind == Extra) && (d.TargetHash == "") == (w.kind == Missing) &&
					(w.kind != Different || d.SourceHash != d.TargetHash)
			}
			if !ok {
				t.Errorf("%s: diffs %+v\nwant %+v", name, diffs, want)
			}
			if st.SourceRows != 2000 || st.Moved != 2 || st.Compared != 1999 || !reflect.DeepEqual(st.Found, map[Kind]int64{Missing: 2, Different: 2, Extra: 1}) {
				t.Errorf("%s: stats %+v", name, st)
			}
			if narrowed := leafRows < 2000; narrowed != (st.Levels > 0) {
				t.Errorf("%s: %d levels of narrowing", name, st.Levels)
			}
			if first == nil {
				first = diffs
			} else if !reflect.DeepEqual(diffs, first) {
				t.Errorf("%s: diffs differ from the first run of the mode:\n%+v\n%+v", name, diffs, first)
			}
		}
	}
}

// Lookup reads the rows of the keys asked for, nil for a key without a row, on either side and
// with the target's filters.
func TestLookup(t *testing.T) {
	env := pgtest.New(t)
	kvTable(t, env, 5)
	pgtest.Exec(t, env.Source, `update s.t set v = null where k = 2`)
	pgtest.Exec(t, env.Target, `update s.t set _cdc_deleted = true where k = 3`, `update s.t set _cdc_lsn = '0/2000' where k = 4`)
	keys := [][]string{{"1"}, {"2"}, {"3"}, {"4"}, {"99"}}
	render := func(rows [][]*string) string {
		var b strings.Builder
		for _, r := range rows {
			if r == nil {
				b.WriteString("- ")
				continue
			}
			for _, v := range r {
				if v == nil {
					b.WriteString("∅")
				} else {
					b.WriteString(*v)
				}
				b.WriteByte(',')
			}
			b.WriteByte(' ')
		}
		return b.String()
	}
	for _, c := range []struct {
		name string
		side Side
		opts LookupOpts
		want string
	}{
		{"source", Source, LookupOpts{}, "1,v1, 2,∅, 3,v3, 4,v4, - "},
		{"target", Target, LookupOpts{}, "1,v1, 2,v2, 3,v3, 4,v4, - "},
		{"target live", Target, LookupOpts{Live: true}, "1,v1, 2,v2, - 4,v4, - "},
		{"target newer than S", Target, LookupOpts{NewerThan: pgSnapshot.String()}, "- - - 4,v4, - "},
	} {
		got, err := Lookup(t.Context(), mustQuerier(env, c.side), c.side, tabKV, keys, c.opts)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if r := render(got); r != c.want {
			t.Errorf("%s: %q, want %q", c.name, r, c.want)
		}
	}
	if _, err := Lookup(t.Context(), env.Source, Source, tabKV, [][]string{{"1", "2"}}, LookupOpts{}); err == nil {
		t.Error("Lookup of a key with two values for one key column succeeded")
	}
}

func mustQuerier(env *pgtest.Env, side Side) Querier {
	if side == Source {
		return env.Source
	}
	return env.Target
}
