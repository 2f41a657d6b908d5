package apply

import (
	"bytes"
	"strconv"
	"strings"

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
