package reconcile

import (
	"strconv"
	"testing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// The hash expressions, golden: built-in types by their own hash functions (text under COLLATE
// "C", so collation never matters), every other type by its text form, MD5 by text for all.
func TestValueHash(t *testing.T) {
	cases := []struct {
		mode HashMode
		oid  uint32
		want string
	}{
		{TypeHash, oidInt4, `hashint4extended("c", 3::int8)`},
		{TypeHash, oidText, `hashtextextended("c"::text collate "C", 3::int8)`},
		{TypeHash, oidTimestamptz, `timestamp_hash_extended("c"::timestamptz at time zone 'UTC', 3::int8)`},
		{TypeHash, oidBool, `hashint4extended("c"::int4, 3::int8)`},
		{TypeHash, oidBpchar, `hashbpcharextended("c"::bpchar collate "C", 3::int8)`},
		{TypeHash, oidUUID, `uuid_hash_extended("c"::uuid, 3::int8)`},
		{TypeHash, 1700, `hashtextextended("c"::text collate "C", 3::int8)`}, // numeric: 1.0 and 1.00 differ
		{MD5, oidInt4, `('x' || substr(md5(3 || ':' || "c"::text), 1, 16))::bit(64)::int8`},
	}
	for _, c := range cases {
		if got := valueHash(c.mode, changebatch.Column{Name: "c", TypeOID: c.oid}, `"c"`, 3); got != c.want {
			t.Errorf("valueHash(%s, %d) = %s, want %s", c.mode, c.oid, got, c.want)
		}
	}
}

// A row's hash covers every column, NULLs by a stand-in per position; the key's hash only the key,
// with other seeds.
func TestRowAndKeyHash(t *testing.T) {
	tab := changebatch.Table{TableName: changebatch.TableName{Schema: "s", Name: "t"}, Columns: []changebatch.Column{
		{Name: "k", TypeOID: oidInt8, Key: true, KeyPos: 1}, {Name: "v", TypeOID: oidText}}}
	wantRow := `(coalesce(hashint8extended("k", 1::int8), ` + itoa(nullHash(0)) + `::int8) # coalesce(hashtextextended("v"::text collate "C", 2::int8), ` + itoa(nullHash(1)) + `::int8))`
	if got := rowHash(TypeHash, tab, ""); got != wantRow {
		t.Errorf("rowHash = %s\nwant %s", got, wantRow)
	}
	if got, want := keyHash(TypeHash, tab, "s."), `coalesce(hashint8extended(s."k", 1048576::int8), `+itoa(nullHash(0))+`::int8)`; got != want {
		t.Errorf("keyHash = %s\nwant %s", got, want)
	}
	if nullHash(0) == nullHash(1) {
		t.Error("NULL stand-ins of two positions are equal")
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
