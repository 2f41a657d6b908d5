// Package reconcile compares one table between the source, read at an exact snapshot S, and the
// target, and narrows every difference down to single keys: the core of `pgconverge verify`.
//
// Invariant: a target row whose version is newer than (S, 0) is never compared (the stream has
// moved it past S), and its key is left out on the source side too; every other key is compared
// exactly, whatever the two databases' collations, by checksums computed inside each database.
//
// The method: each row gets a 64-bit hash of its values (hashExpr) and its key a 64-bit hash of
// the key's values; both sides sum the row hashes and count the rows, first over the whole table,
// then grouped by bits of the key hash, recursing only into groups whose sums or counts differ
// (pg_comparator's key-hash grouping, which makes collation irrelevant, with datafold data-diff's
// recursion into mismatching segments), and once the mismatching groups hold few rows, fetches
// their keys and row hashes from both sides and compares them in memory. Both sides are queried
// concurrently. Grouping by a hash of the key needs no order, so no key range is ever compared
// under two different collations.
package reconcile
