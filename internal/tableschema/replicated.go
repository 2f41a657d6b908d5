package tableschema

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// TwinPrefix begins the name of a unique index's twin on a replicated target table (Replicated):
// being a _cdc_ name, it is pgconverge's own, dropped by cutover --finalize.
const TwinPrefix = "_cdc_"

// maxIdentifier is the longest name PostgreSQL keeps (NAMEDATALEN - 1 bytes).
const maxIdentifier = 63

// ReplicatedIndex is an index a target table has while pgconverge replicates into it: Name, and
// Def, its CREATE INDEX statement; Source is the source's index or constraint it stands for.
type ReplicatedIndex struct {
	Name, Def, Source string
}

// Concurrently returns Def as CREATE INDEX CONCURRENTLY, which builds the index without blocking
// the table's writes (PostgreSQL docs, CREATE INDEX, "Building Indexes Concurrently").
func (i ReplicatedIndex) Concurrently() string {
	return strings.Replace(i.Def, "CREATE INDEX ", "CREATE INDEX CONCURRENTLY ", 1)
}

// Replicated returns the indexes a target table replicated from s should have while it is
// replicated: each of s's non-unique indexes as it is, and for each unique index, unique and
// exclusion constraint a twin without its uniqueness (TwinPrefix and its name), so that queries
// use it but neither tombstones, nor the rows of a transaction applied part by part, nor the
// stream's order of keys can make a write fail. The key's index is the target's already. An
// index whose definition cannot be read as CREATE [UNIQUE] INDEX <name> ON is returned in
// skipped, with the reason.
func Replicated(s Schema) (out []ReplicatedIndex, skipped []string) {
	type source struct {
		name, quoted, def string
		unique            bool
	}
	var all []source
	for _, i := range s.Indexes {
		all = append(all, source{i.Name, i.quoted, i.Def, i.Unique})
	}
	for _, c := range s.Constraints {
		if c.Kind == 'u' || c.Kind == 'x' {
			all = append(all, source{c.Name, c.quoted, c.index, true})
		}
	}
	for _, a := range all {
		if !a.unique {
			out = append(out, ReplicatedIndex{Name: a.name, Def: a.def, Source: a.name})
			continue
		}
		rest, ok := strings.CutPrefix(a.def, "CREATE UNIQUE INDEX "+a.quoted+" ON ")
		if !ok {
			rest, ok = strings.CutPrefix(a.def, "CREATE INDEX "+a.quoted+" ON ")
		}
		if !ok {
			skipped = append(skipped, fmt.Sprintf("%s: definition %q not understood", a.name, a.def))
			continue
		}
		twin := TwinName(a.name)
		rest = strings.Replace(rest, " NULLS NOT DISTINCT", "", 1)
		out = append(out, ReplicatedIndex{Name: twin, Def: "CREATE INDEX " + pgx.Identifier{twin}.Sanitize() + " ON " + rest, Source: a.name})
	}
	return out, skipped
}

// TwinName returns the name of unique index name's twin: TwinPrefix and name, cut to the 63
// bytes PostgreSQL keeps, at a character boundary.
func TwinName(name string) string {
	twin := TwinPrefix + name
	for len(twin) > maxIdentifier {
		r := []rune(twin)
		twin = string(r[:len(r)-1])
	}
	return twin
}
