package apply

import (
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// A piece of at most inlineRows rows with values of at most inlineBytes bytes is merged inline:
// its rows travel as one text[] parameter of the upsert, each a record literal of the staging
// table's row type (PostgreSQL docs §8.16.6 "Composite Type Input and Output Syntax"), which
// the server parses with the columns' input functions and type modifiers as COPY does. The
// staging table then serves as the row type only: a group of small source transactions costs one
// statement per table, where staging costs three and a COPY (emptying the staging table, the COPY,
// the upsert). A larger piece is staged by COPY, which streams.
const (
	inlineRows  = 1000
	inlineBytes = 1 << 20
)

// CopyOnlyTables is the set of target tables whose inline merge a value failed to parse or fit
// (noteInlineError): the server names the value but not its row, so every Applier that shares the
// set stages those tables' rows by COPY from then on, whose error names the row, its key and the
// column (describeCopyError) when the caller retries. A table is told apart by its target
// database (host, port and database name as the connection reached it, targetDatabase) and its
// qualified name. A daemon keeps one set for its whole life and gives it to every Applier it
// makes (its sessions', their backfill workers', its fills of unknown values), so that a retry
// in a later session stages by COPY too. The zero value is an empty set; it is safe for
// concurrent use.
type CopyOnlyTables struct {
	mu     sync.Mutex
	tables map[string]bool
}

// copyOnlyKey is CopyOnlyTables' key of table tab in target database db.
func copyOnlyKey(db string, tab changebatch.TableName) string {
	return db + "\x00" + tab.String()
}

// has reports whether tab, in target database db, is staged by COPY only; false on a nil set.
func (c *CopyOnlyTables) has(db string, tab changebatch.TableName) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tables[copyOnlyKey(db, tab)]
}

// add marks tab, in target database db, to be staged by COPY from now on.
func (c *CopyOnlyTables) add(db string, tab changebatch.TableName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tables == nil {
		c.tables = map[string]bool{}
	}
	c.tables[copyOnlyKey(db, tab)] = true
}

// copyOnlyIn is a CopyOnlyTables as one target database sees it (Tx.copyOnly).
type copyOnlyIn struct {
	set *CopyOnlyTables
	db  string
}

// has reports whether tab is staged by COPY only.
func (c copyOnlyIn) has(tab changebatch.TableName) bool { return c.set.has(c.db, tab) }

// source is where an upsert reads the rows of a piece: the staging table stage, filled by COPY,
// or, when records is not nil, the records themselves (inlineRecords) as a parameter.
type source struct {
	stage   string
	records []string
	// streamed, when set, is the rows of a streamed transaction staged ahead of its commit
	// (StreamedRows), whose versions take the commit's LSN.
	streamed *streamedSource
}

// from returns the FROM item (aliased stg) that yields the piece's rows in the staging table's
// columns, and args with its parameter appended when it takes one.
func (s source) from(args []any) (string, []any) {
	if s.streamed != nil {
		return s.streamed.from(args)
	}
	q := pgx.Identifier{"pg_temp", s.stage}.Sanitize()
	if s.records == nil {
		return q + " as stg", args
	}
	args = append(args, s.records)
	return "unnest($" + strconv.Itoa(len(args)) + "::text[]::" + q + "[]) as stg", args
}

// inlineRecords returns rows as record literals of the staging table's columns (copyColumns,
// then _cdc_moved; the values as encodeCopyText writes them), or nil when there are more than
// inlineRows rows or more than inlineBytes bytes of values, or tab is to be staged by COPY
// (copyOnly).
func inlineRecords(copyOnly copyOnlyIn, tab changebatch.Table, rows []stagedRow) []string {
	if len(rows) > inlineRows {
		return nil
	}
	if copyOnly.has(tab.TableName) {
		return nil
	}
	size := 0
	for _, r := range rows {
		for _, v := range r.values {
			size += len(v.Text)
		}
	}
	if size > inlineBytes {
		return nil
	}
	out := make([]string, len(rows))
	var b strings.Builder
	var unknown []string
	for i, r := range rows {
		b.Reset()
		b.Grow(size/len(rows) + 3*len(r.values) + 48)
		unknown = unknown[:0]
		b.WriteByte('(')
		for j, v := range r.values {
			switch {
			case v.Unchanged:
				unknown = append(unknown, tab.Columns[j].Name)
			case !v.Null:
				writeRecordField(&b, v.Text)
			}
			b.WriteByte(',')
		}
		b.WriteString(r.version.LSN.String())
		b.WriteByte(',')
		b.WriteString(strconv.FormatUint(r.version.Seq, 10))
		if r.op == changebatch.OpDelete {
			b.WriteString(",t,")
		} else {
			b.WriteString(",f,")
		}
		if len(unknown) > 0 {
			writeRecordField(&b, arrayLiteral(unknown))
		}
		if len(unknown) > 0 && r.moved {
			b.WriteString(",t)")
		} else {
			b.WriteString(",f)")
		}
		out[i] = b.String()
	}
	return out
}

// writeRecordField writes s as a double-quoted field of a record literal: quoted, an empty
// string is not NULL, and no delimiter or whitespace in it counts; `"` and `\` are escaped.
func writeRecordField(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
}

// noteInlineError marks tab to be staged by COPY (copyOnly) when err, from an inline merge, is a
// value the target refused (SQLSTATE class 22, or a domain's CHECK or NOT NULL, 23514 and 23502,
// which a record's input checks too), and says so in the error it returns.
func noteInlineError(copyOnly copyOnlyIn, tab changebatch.Table, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !strings.HasPrefix(pgErr.Code, "22") && pgErr.Code != pgerrcode.CheckViolation && pgErr.Code != pgerrcode.NotNullViolation {
		return err
	}
	copyOnly.set.add(copyOnly.db, tab.TableName)
	return errors.Join(err, errors.New("the next attempt stages the rows by COPY, whose error names the refused row"))
}
