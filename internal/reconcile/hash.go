package reconcile

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// HashMode chooses how a value is hashed inside the databases.
type HashMode int

const (
	// TypeHash hashes values of common built-in types with their types' own extended hash
	// functions (hashint4extended, hashtextextended under COLLATE "C", uuid_hash_extended, …),
	// each of which distinguishes exactly the values the type's text form distinguishes, and every
	// other value by its text form (hashtextextended over value::text COLLATE "C"). It is about 3×
	// cheaper than MD5; PostgreSQL's byte hashes depend on the server's byte order, so both sides
	// must agree (Probe).
	TypeHash HashMode = iota
	// MD5 hashes every value's text form with md5 (64 bits of it): portable between any two
	// servers, and slower.
	MD5
)

// String names the mode for reports.
func (m HashMode) String() string {
	if m == MD5 {
		return "md5"
	}
	return "type-hash"
}

// probeSQL hashes fixed values of every byte-hashing type TypeHash uses.
const probeSQL = `select hashtextextended('pgconverge ü probe' collate "C", 7::int8)::text || ',' ||
  hashbpcharextended('probe ü'::bpchar collate "C", 7::int8)::text || ',' ||
  uuid_hash_extended('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 7::int8)::text || ',' || hashint8extended(-3, 7::int8)::text`

// Probe returns TypeHash when both sides hash the probe values alike, else MD5 (servers of
// different byte order). src and tgt are open transactions or connections.
func Probe(ctx context.Context, src, tgt Querier) (HashMode, error) {
	var a, b string
	if err := src.QueryRow(ctx, probeSQL).Scan(&a); err != nil {
		return MD5, fmt.Errorf("probe the source's hash functions: %w", err)
	}
	if err := tgt.QueryRow(ctx, probeSQL).Scan(&b); err != nil {
		return MD5, fmt.Errorf("probe the target's hash functions: %w", err)
	}
	if a != b {
		return MD5, nil
	}
	return TypeHash, nil
}

// Querier is what the comparison needs of a transaction: pgx.Tx and *pgx.Conn have it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Built-in type oids that TypeHash hashes with their own hash functions (pg_type.oid).
const (
	oidBool        = 16
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidText        = 25
	oidBpchar      = 1042
	oidVarchar     = 1043
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidUUID        = 2950
)

// valueHash returns the SQL expression of the 64-bit hash of column c (quoted name q) with seed,
// NULL when the value is NULL. The column's type is taken from the source description; the
// target's column has the same type, or (a NOT NULL domain) its base type, whose text form is the
// same, and only the text form is used for types TypeHash does not know.
func valueHash(mode HashMode, c changebatch.Column, q string, seed int64) string {
	s := strconv.FormatInt(seed, 10) + "::int8"
	if mode == MD5 {
		return "('x' || substr(md5(" + strconv.FormatInt(seed, 10) + " || ':' || " + q + "::text), 1, 16))::bit(64)::int8"
	}
	h, ok := typeHashes[c.TypeOID]
	if !ok {
		h = typeHash{"hashtextextended", `::text collate "C"`} // by the text form
	}
	return h.fn + "(" + q + h.cast + ", " + s + ")"
}

// typeHash is a type's extended hash function and the cast (or expression tail) its argument
// takes.
type typeHash struct{ fn, cast string }

// typeHashes are the hash functions TypeHash uses per type oid: text types under COLLATE "C", a
// timestamptz as the UTC timestamp it stands for (the same instant whatever the session's time
// zone), a bool as 0 or 1.
var typeHashes = map[uint32]typeHash{
	oidInt2:        {"hashint2extended", ""},
	oidInt4:        {"hashint4extended", ""},
	oidInt8:        {"hashint8extended", ""},
	oidBool:        {"hashint4extended", "::int4"},
	oidText:        {"hashtextextended", `::text collate "C"`},
	oidVarchar:     {"hashtextextended", `::text collate "C"`},
	oidBpchar:      {"hashbpcharextended", `::bpchar collate "C"`},
	oidUUID:        {"uuid_hash_extended", "::uuid"},
	oidTimestamp:   {"timestamp_hash_extended", "::timestamp"},
	oidTimestamptz: {"timestamp_hash_extended", "::timestamptz at time zone 'UTC'"},
}

// nullHash is the hash a NULL in column position i stands for: a fixed value per position
// (splitmix64 of it), so a NULL and a value are told apart and a NULL moving between columns
// changes the row's hash.
func nullHash(i int) int64 {
	z := uint64(i+1) * 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return int64(z ^ (z >> 31))
}

// Seeds of the two hashes: the key hash's columns and the row hash's columns are hashed with
// different seeds, so the row hash is independent of the bits that group rows.
const (
	rowSeed = 1
	keySeed = 1 << 20
)

// combine XORs the hashes of columns idx of t, each with its position's seed and NULL stand-in;
// qual ("" or "alias.") qualifies the column names.
func combine(mode HashMode, t changebatch.Table, idx []int, seedBase int64, qual string) string {
	parts := make([]string, len(idx))
	for j, i := range idx {
		q := qual + pgx.Identifier{t.Columns[i].Name}.Sanitize()
		parts[j] = "coalesce(" + valueHash(mode, t.Columns[i], q, seedBase+int64(i)) + ", " + strconv.FormatInt(nullHash(i), 10) + "::int8)"
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return "(" + strings.Join(parts, " # ") + ")"
}

// rowHash is the SQL expression of a row's hash: every column of t (the source's replicated
// columns; generated columns are computed, not compared).
func rowHash(mode HashMode, t changebatch.Table, qual string) string {
	idx := make([]int, len(t.Columns))
	for i := range idx {
		idx[i] = i
	}
	return combine(mode, t, idx, rowSeed, qual)
}

// keyHash is the SQL expression of the hash of a row's key, whose low bits group rows.
func keyHash(mode HashMode, t changebatch.Table, qual string) string {
	return combine(mode, t, t.KeyOrder(), keySeed, qual)
}

// keyTexts is the select list of t's key columns as text, in KeyOrder.
func keyTexts(t changebatch.Table) []string {
	var out []string
	for _, i := range t.KeyOrder() {
		out = append(out, pgx.Identifier{t.Columns[i].Name}.Sanitize()+"::text")
	}
	return out
}
