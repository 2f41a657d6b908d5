// Package tableschema reads the schema objects of a table from a PostgreSQL's catalogs (columns
// with their types, NOT NULL, defaults and identities, constraints, indexes, triggers, comments),
// compares a target table's with its source table's object by object (Compare), and names for each
// difference the statements that fix it. cutover --finalize runs those statements (Carry), and
// verify --schema reports them.
//
// Everything is read with the catalog functions every supported server has (pg_get_expr,
// pg_get_constraintdef, pg_get_indexdef, pg_get_triggerdef; PostgreSQL docs §9.27, "System
// Information Functions and Operators"), so a source of one major version and a target of another
// compare by the definitions each server prints.
//
// Invariant: Carry only adds or replaces what the source has; it never drops an object the source
// lacks (the target's own), and everything it does for a table commits in one transaction.
package tableschema
