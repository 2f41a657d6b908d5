package changebatch

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// TableName is a schema-qualified table name, each part unquoted as PostgreSQL stores it. It is
// the one identity of a table across cdc, backfill, apply, coverage and the engine: comparable,
// so it serves as a map key; String gives the form for people, Quoted the form for SQL.
type TableName struct{ Schema, Name string }

// String returns the table's name for logs, errors and metric labels: schema.name, with a part
// double-quoted only when it needs quoting (QualifiedName). Build SQL with Quoted instead.
func (n TableName) String() string { return QualifiedName(n.Schema, n.Name) }

// Quoted returns the table's name quoted for SQL: "schema"."name".
func (n TableName) Quoted() string { return pgx.Identifier{n.Schema, n.Name}.Sanitize() }

// QuoteLiteral returns s as an SQL escape string constant (PostgreSQL docs §4.1.2.2, "String
// Constants with C-Style Escapes"), quotes and backslashes doubled, which reads the same whatever
// standard_conforming_strings is: for statements that take no parameters (COPY, DDL).
func QuoteLiteral(s string) string {
	return "E'" + strings.NewReplacer(`'`, `''`, `\`, `\\`).Replace(s) + "'"
}

var plainName = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// QualifiedName renders schema.name for people: a part that is lower-case letters, digits and
// underscores stays bare, any other part is double-quoted as in SQL (`"My Schema".t`). It is
// unambiguous, so it also serves as a map key.
func QualifiedName(schema, name string) string {
	part := func(p string) string {
		if plainName.MatchString(p) {
			return p
		}
		return `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return part(schema) + "." + part(name)
}

// ParseTableName parses "schema.table" as SQL would: unquoted parts fold to lower case,
// double-quoted parts keep dots and case (`"My Schema"."T.1"`), and a name without a schema means
// "public". The error names the input and what is wrong with it.
func ParseTableName(s string) (TableName, error) {
	parts, err := splitQualified(s)
	if err != nil {
		return TableName{}, fmt.Errorf("table name %q: %w", s, err)
	}
	switch len(parts) {
	case 1:
		return TableName{"public", parts[0]}, nil
	case 2:
		return TableName{parts[0], parts[1]}, nil
	}
	return TableName{}, fmt.Errorf("table name %q: want schema.table", s)
}

// ParseTableList parses lists of comma-separated table names (SplitTableList, then
// ParseTableName), as flags that may be repeated give them, in order and without duplicates. The
// error joins every name's problem.
func ParseTableList(lists []string) ([]TableName, error) {
	var out []TableName
	var errs []error
	seen := map[TableName]bool{}
	for _, list := range lists {
		for _, s := range SplitTableList(list) {
			n, err := ParseTableName(s)
			switch {
			case err != nil:
				errs = append(errs, err)
			case !seen[n]:
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	return out, errors.Join(errs...)
}

// SplitTableList splits a comma-separated list of table names, keeping commas inside double
// quotes: `a.b,"x,y".z` is ["a.b", `"x,y".z`]. Parse each element with ParseTableName.
func SplitTableList(s string) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

func splitQualified(s string) ([]string, error) {
	parts, _, err := splitParts(s)
	return parts, err
}

// finishPart folds an unquoted part to lower case, as PostgreSQL does with unquoted identifiers.
func finishPart(p string, quoted bool) string {
	if quoted {
		return p
	}
	return strings.ToLower(p)
}
