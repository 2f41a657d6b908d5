package changebatch

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// TablePattern selects the tables whose schema and name match it: a --tables entry with a glob
// (* for any run of characters, ? for one) in an unquoted part, such as public.* or
// sales.order_*. Unquoted parts fold to lower case as names do; a double-quoted part is matched
// literally, * and ? included.
type TablePattern struct {
	// Text is the entry as given.
	Text          string
	schema, name  *regexp.Regexp
	schemaLiteral string
	nameLiteral   string
	schemaIsGlob  bool
	nameIsGlob    bool
}

// String returns the pattern as given.
func (p TablePattern) String() string { return p.Text }

// Match reports whether table n matches the pattern.
func (p TablePattern) Match(n TableName) bool {
	return matchPart(n.Schema, p.schemaIsGlob, p.schema, p.schemaLiteral) && matchPart(n.Name, p.nameIsGlob, p.name, p.nameLiteral)
}

func matchPart(s string, glob bool, re *regexp.Regexp, literal string) bool {
	if glob {
		return re.MatchString(s)
	}
	return s == literal
}

// ParseTableSelection parses --tables lists (SplitTableList) into names (ParseTableName) and
// patterns (an entry with an unquoted * or ?; without a schema part its schema is public), each
// without duplicates, in order. The error joins every entry's problem.
func ParseTableSelection(lists []string) ([]TableName, []TablePattern, error) {
	var names []TableName
	var patterns []TablePattern
	var errs []error
	seen := map[string]bool{}
	for _, list := range lists {
		for _, s := range SplitTableList(list) {
			if seen[s] {
				continue
			}
			seen[s] = true
			p, isPattern, err := parsePattern(s)
			switch {
			case err != nil:
				errs = append(errs, err)
			case isPattern:
				patterns = append(patterns, p)
			default:
				n, err := ParseTableName(s)
				if err != nil {
					errs = append(errs, err)
				} else if !containsName(names, n) {
					names = append(names, n)
				}
			}
		}
	}
	return names, patterns, errors.Join(errs...)
}

func containsName(names []TableName, n TableName) bool {
	for _, m := range names {
		if m == n {
			return true
		}
	}
	return false
}

// parsePattern parses s as a pattern; isPattern is false when no unquoted part has a glob.
func parsePattern(s string) (TablePattern, bool, error) {
	parts, quoted, err := splitParts(s)
	if err != nil {
		return TablePattern{}, false, fmt.Errorf("table name %q: %w", s, err)
	}
	glob := func(i int) bool { return !quoted[i] && strings.ContainsAny(parts[i], "*?") }
	switch len(parts) {
	case 1:
		parts, quoted = []string{"public", parts[0]}, []bool{true, quoted[0]}
	case 2:
	default:
		return TablePattern{}, false, fmt.Errorf("table name %q: want schema.table", s)
	}
	if !glob(0) && !glob(1) {
		return TablePattern{}, false, nil
	}
	p := TablePattern{Text: s, schemaIsGlob: glob(0), nameIsGlob: glob(1)}
	p.schema, p.schemaLiteral = globRegexp(parts[0]), parts[0]
	p.name, p.nameLiteral = globRegexp(parts[1]), parts[1]
	return p, true, nil
}

// globRegexp returns the anchored regular expression of glob g (* any run, ? one character).
func globRegexp(g string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	for _, r := range g {
		switch r {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// splitParts splits a qualified name as splitQualified does and says which parts were quoted.
func splitParts(s string) ([]string, []bool, error) {
	var parts []string
	var quotedParts []bool
	var cur strings.Builder
	quoted, wasQuoted := false, false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quoted && ch == '"' && i+1 < len(s) && s[i+1] == '"':
			cur.WriteByte('"')
			i++
		case ch == '"':
			quoted = !quoted
			wasQuoted = true
		case ch == '.' && !quoted:
			parts, quotedParts = append(parts, finishPart(cur.String(), wasQuoted)), append(quotedParts, wasQuoted)
			cur.Reset()
			wasQuoted = false
		default:
			cur.WriteByte(ch)
		}
	}
	if quoted {
		return nil, nil, errors.New("unterminated double quote")
	}
	parts, quotedParts = append(parts, finishPart(cur.String(), wasQuoted)), append(quotedParts, wasQuoted)
	for _, p := range parts {
		if p == "" {
			return nil, nil, errors.New("empty name part")
		}
	}
	return parts, quotedParts, nil
}
