package apply

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// encodeCopyText writes rows in COPY text format (PostgreSQL docs, COPY, "Text Format"): the
// data columns, then _cdc_lsn, _cdc_seq, _cdc_deleted, _cdc_unknown, _cdc_moved. A column the row
// left unchanged is written as NULL and named in _cdc_unknown so the upsert keeps the target's
// value; _cdc_moved is true for a moved row that still has such columns.
func encodeCopyText(buf *bytes.Buffer, t changebatch.Table, rows []stagedRow) {
	var unknown []string
	for _, r := range rows {
		unknown = unknown[:0]
		for i, v := range r.values {
			switch {
			case v.Unchanged:
				buf.WriteString(`\N`)
				unknown = append(unknown, t.Columns[i].Name)
			case v.Null:
				buf.WriteString(`\N`)
			default:
				writeCopyEscaped(buf, v.Text)
			}
			buf.WriteByte('\t')
		}
		buf.WriteString(r.version.LSN.String())
		buf.WriteByte('\t')
		buf.WriteString(strconv.FormatUint(r.version.Seq, 10))
		buf.WriteByte('\t')
		if r.op == changebatch.OpDelete {
			buf.WriteString("t\t")
		} else {
			buf.WriteString("f\t")
		}
		if len(unknown) == 0 {
			buf.WriteString("\\N\tf\n")
			continue
		}
		writeCopyEscaped(buf, arrayLiteral(unknown))
		if r.moved {
			buf.WriteString("\tt\n")
		} else {
			buf.WriteString("\tf\n")
		}
	}
}

// writeCopyEscaped writes s with the backslash escapes COPY text format needs.
func writeCopyEscaped(buf *bytes.Buffer, s string) {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '\\' || c == '\t' || c == '\n' || c == '\r' {
			clean = false
			break
		}
	}
	if clean {
		buf.WriteString(s)
		return
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			buf.WriteString(`\\`)
		case '\t':
			buf.WriteString(`\t`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		default:
			buf.WriteByte(c)
		}
	}
}

// arrayLiteral renders a text[] literal with every element double-quoted (PostgreSQL docs §8.15.6
// "Array Input and Output Syntax").
func arrayLiteral(elems []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(e); j++ {
			if e[j] == '"' || e[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(e[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// withCopyContext returns err with PostgreSQL's context of a failed COPY, which names the line, the
// column and the refused value ("COPY t, line 3, column v: \"x\""); err unchanged without one.
func withCopyContext(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Where == "" {
		return err
	}
	return fmt.Errorf("%w (%s)", err, pgErr.Where)
}

// copyLine finds the line and column PostgreSQL names in the context of a failed COPY
// ("COPY stage, line 3, column v: ...").
var copyLine = regexp.MustCompile(`, line (\d+)(?:, column ([^:]+))?`)

// describeCopyError returns err with the row the target refused named by its key and version and,
// when PostgreSQL names it, the column and the value as the source sent it, so an operator can
// find the row on the source; err unchanged when the error names no line of rows.
func describeCopyError(t changebatch.Table, rows []stagedRow, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	m := copyLine.FindStringSubmatch(pgErr.Where)
	if m == nil {
		return err
	}
	line, convErr := strconv.Atoi(m[1])
	if convErr != nil || line < 1 || line > len(rows) {
		return err
	}
	r := rows[line-1]
	var keys, vals []string
	for _, i := range t.KeyOrder() {
		keys = append(keys, t.Columns[i].Name)
		vals = append(vals, r.values[i].Text)
	}
	where := fmt.Sprintf("the row with key (%s) = (%s), version %s", strings.Join(keys, ", "), strings.Join(vals, ", "), r.version)
	if i := t.ColumnIndex(m[2]); i >= 0 && !r.values[i].Null && !r.values[i].Unchanged {
		v := r.values[i].Text
		if len(v) > 200 {
			v = v[:200] + "…"
		}
		where += fmt.Sprintf(", column %q (type %s) with value %q", m[2], t.Columns[i].Type, v)
	}
	return fmt.Errorf("the target refused %s: %w", where, err)
}
