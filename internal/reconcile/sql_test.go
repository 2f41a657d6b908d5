package reconcile

import (
	"errors"
	"slices"
	"testing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// The SQL each step of a comparison sends, golden, recorded without a database. kh and rh, the
// key's and the row's hash expressions, are golden in hash_test.go.

func newRecorded(cfg Config) (*comparison, *recorder, *recorder) {
	src, tgt := &recorder{}, &recorder{}
	c := &comparison{cfg: cfg, src: src, tgt: tgt, rowH: rowHash(cfg.Mode, cfg.Table, ""), keyH: keyHash(cfg.Mode, cfg.Table, ""),
		current: current, stats: Stats{Found: map[Kind]int64{}}}
	return c, src, tgt
}

func wantSQL(t *testing.T, step string, got *recorder, want ...string) {
	t.Helper()
	if !slices.Equal(got.sqls, want) {
		t.Errorf("%s:\n got %q\nwant %q", step, got.sqls, want)
	}
}

func TestWholeTableChecksumSQL(t *testing.T) {
	src, tgt := &recorder{}, &recorder{}
	_, err := Compare(t.Context(), src, tgt, Config{Table: tabKV, Snapshot: 0x1000})
	if !errors.Is(err, errRecorded) {
		t.Fatalf("Compare = %v", err)
	}
	rh := rowHash(TypeHash, tabKV, "")
	wantSQL(t, "source", src, `select count(*), coalesce(sum(h), 0)::text from (select `+rh+` as h from only "s"."t" as t) s`)
	wantSQL(t, "target", tgt, `select count(*) filter (where cur), coalesce(sum(h) filter (where cur), 0)::text, count(*) filter (where not cur and newer) from (select `+
		rh+` as h, ("_cdc_lsn", "_cdc_seq") <= ($1::pg_lsn, 0) and not "_cdc_deleted" as cur, ("_cdc_lsn", "_cdc_seq") > ($1::pg_lsn, 0) as newer from "s"."t") s`)
}

// A level splits each mismatching group into about an eighth of its rows' worth of groups
// (2^k with k bits more), at most MaxGroups in all.
func TestSplitSQL(t *testing.T) {
	kh, rh := keyHash(TypeHash, tabKV, ""), rowHash(TypeHash, tabKV, "")
	for _, c := range []struct {
		name      string
		l         levelState
		maxGroups int
		mask      string
	}{
		{"800 rows in one group: 7 bits more", levelState{bits: 1, ids: []int64{1}, rows: 800}, 65536, "255"},
		{"bounded by MaxGroups", levelState{bits: 1, ids: []int64{1}, rows: 800}, 8, "15"},
		{"few rows: one bit more", levelState{bits: 1, ids: []int64{1}, rows: 3}, 65536, "3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmp, src, tgt := newRecorded(Config{Table: tabKV, Snapshot: 0x1000, MaxGroups: c.maxGroups})
			if _, err := cmp.split(t.Context(), c.l); !errors.Is(err, errRecorded) {
				t.Fatalf("split = %v", err)
			}
			wantSQL(t, "source", src, "select hk & "+c.mask+", count(*), sum(h)::text from (select "+kh+" as hk, "+rh+
				` as h from only "s"."t" as t) s where (hk & 1) = any('{1}'::int8[]) group by 1`)
			wantSQL(t, "target", tgt, "select hk & "+c.mask+", count(*), sum(h)::text from (select "+kh+" as hk, "+rh+
				` as h from "s"."t" where ("_cdc_lsn", "_cdc_seq") <= ($1::pg_lsn, 0) and not "_cdc_deleted") s where (hk & 1) = any('{1}'::int8[]) group by 1`)
		})
	}
}

func TestLeafSQL(t *testing.T) {
	kh, rh := keyHash(TypeHash, tabKV, ""), rowHash(TypeHash, tabKV, "")
	c, src, tgt := newRecorded(Config{Table: tabKV, Snapshot: 0x1000})
	if err := c.leaf(t.Context(), levelState{bits: 2, ids: []int64{3}}); !errors.Is(err, errRecorded) {
		t.Fatalf("leaf = %v", err)
	}
	wantSQL(t, "source", src, "select hk, h, k0 from (select "+kh+" as hk, "+rh+` as h, "k"::text collate "C" as k0 from only "s"."t" as t) s`+
		` where (hk & 3) = any('{3}'::int8[]) order by hk, k0`)
	wantSQL(t, "target", tgt, "select hk, h, k0, lsn, seq, deleted from (select "+kh+" as hk, "+rh+` as h, "k"::text collate "C" as k0, `+
		`"_cdc_lsn"::text as lsn, "_cdc_seq" as seq, "_cdc_deleted" as deleted from "s"."t") s where (hk & 3) = any('{3}'::int8[]) order by hk, k0`)
}

func TestLoadMovedSQL(t *testing.T) {
	c, _, tgt := newRecorded(Config{Table: tabKV, Snapshot: 0x1000})
	if err := c.loadMoved(t.Context()); !errors.Is(err, errRecorded) {
		t.Fatalf("loadMoved = %v", err)
	}
	wantSQL(t, "target", tgt, `select "k"::text from "s"."t" where ("_cdc_lsn", "_cdc_seq") > ($1::pg_lsn, 0)`)
}

// A keyless table groups by the hash of the whole value, and its leaf counts each value's copies.
func TestKeylessSQL(t *testing.T) {
	tab := changebatch.Table{TableName: tabKV.TableName, Keyless: true, Columns: []changebatch.Column{
		{Name: "a", TypeOID: oidInt4}, {Name: "b", TypeOID: oidText}}}
	gh := valueGroupHash(TypeHash, tab)
	if want := `(coalesce(hashint4extended("a", 1048576::int8), ` + itoa(nullHash(0)) + `::int8) # coalesce(hashtextextended("b"::text collate "C", 1048577::int8), ` +
		itoa(nullHash(1)) + `::int8))`; gh != want {
		t.Errorf("valueGroupHash = %s\nwant %s", gh, want)
	}
	if got, want := ValueKeySQL(TypeHash, tab, "e."), "lpad(to_hex("+combine(TypeHash, tab, []int{0, 1}, keySeed, "e.")+"), 16, '0') || lpad(to_hex("+
		combine(TypeHash, tab, []int{0, 1}, rowSeed, "e.")+"), 16, '0')"; got != want {
		t.Errorf("ValueKeySQL = %s\nwant %s", got, want)
	}
	c, src, tgt := newRecorded(Config{Table: tab, Snapshot: 0x1000})
	c.keyH, c.current = gh, keylessCurrent
	if err := c.leafKeyless(t.Context(), levelState{}); !errors.Is(err, errRecorded) {
		t.Fatalf("leafKeyless = %v", err)
	}
	rh := rowHash(TypeHash, tab, "")
	wantSQL(t, "source", src, "select hk, h, count(*) from (select "+gh+" as hk, "+rh+` as h from only "s"."t" as t) s where true group by hk, h`)
	wantSQL(t, "target", tgt, "select hk, h, count(*) from (select "+gh+" as hk, "+rh+` as h from "s"."t" where ("_cdc_lsn", "_cdc_seq") <= ($1::pg_lsn, 0)`+
		` and not ("_cdc_deleted" and ("_cdc_deleted_lsn", "_cdc_deleted_seq") <= ($1::pg_lsn, 0))) s where true group by hk, h`)
}

func TestLookupSQL(t *testing.T) {
	keys := [][]string{{"1"}, {"2"}}
	join := `join unnest($1::text[]) with ordinality as u(k0, ord) on s."k" = u.k0::bigint`
	for _, c := range []struct {
		name string
		side Side
		opts LookupOpts
		want string
	}{
		{"source", Source, LookupOpts{}, `select u.ord, array[s."k"::text, s."v"::text]::text[] from only "s"."t" as s ` + join},
		{"target", Target, LookupOpts{}, `select u.ord, array[s."k"::text, s."v"::text]::text[] from "s"."t" as s ` + join},
		{"target live newer", Target, LookupOpts{Live: true, NewerThan: "0/1000"}, `select u.ord, array[s."k"::text, s."v"::text]::text[] from "s"."t" as s ` + join +
			` and not s."_cdc_deleted" and (s."_cdc_lsn", s."_cdc_seq") > ($2::pg_lsn, 0)`},
	} {
		rec := &recorder{}
		if _, err := Lookup(t.Context(), rec, c.side, tabKV, keys, c.opts); !errors.Is(err, errRecorded) {
			t.Fatalf("%s: Lookup = %v", c.name, err)
		}
		wantSQL(t, c.name, rec, c.want)
	}
	rec := &recorder{}
	if out, err := Lookup(t.Context(), rec, Source, tabKV, nil, LookupOpts{}); err != nil || len(out) != 0 || len(rec.sqls) != 0 {
		t.Errorf("Lookup of no keys = %v, %v after %d queries, want nothing asked", out, err, len(rec.sqls))
	}
}
