package apply

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// CopyRows writes snapshot rows of a table to w as a source COPY TO prints them
// (backfill.CopyChunk): the table's data columns in changebatch.Table.Columns order, one line
// per row in text format (PostgreSQL docs, COPY, "Text Format"), or, when binary is true, the
// whole binary format with its header and trailer ("Binary Format"). It returns how many rows it
// wrote.
type CopyRows func(w io.Writer, binary bool) (int64, error)

// copyThroughBuffer is how many bytes of rows are gathered before they are handed to the target
// COPY (256 KiB): large enough that the two sides exchange few buffers, small enough to bound the
// memory of a copy.
const copyThroughBuffer = 256 << 10

// CopySnapshotRows writes the rows that rows writes, every one a snapshot row of tab at version
// ver (S, 0), with one COPY straight into the target table. The bytes are not parsed: each line
// only gets the version columns appended, or, during a bulk load at ver (DeferKey), the target
// fills them from its defaults and the source's output passes through unchanged, in binary
// format when binaryOK says both servers share it for tab's columns. It has the version rule's
// own outcome when the target holds none of the keys, checked against the table's fence first
// (locked FOR SHARE until the transaction ends; at or above ver, rows are read and counted as
// suppressed, and nothing is written). When the target holds one of the keys, the COPY fails with
// a unique violation and CopySnapshotRows returns conflict true; the transaction is then unusable,
// and the caller rolls it back and merges the rows instead. It returns how many rows rows wrote.
// sourceMajor is the source's major version (pgsession.MajorVersion). rows runs in a goroutine of its own; after the
// target's COPY ended early it keeps reading and drops what it reads, so its source connection
// stays usable.
func (t *Tx) CopySnapshotRows(ctx context.Context, tab changebatch.Table, ver changebatch.Version, sourceMajor int, rows CopyRows) (res Result, n int64, conflict bool, err error) {
	if tab.Keyless || ver.Seq != 0 {
		return res, 0, false, fmt.Errorf("copy snapshot rows of %s at %s: only a keyed table's rows at a snapshot version (S, 0) can be copied", tab, ver)
	}
	fence, err := t.lockFence(ctx, tab)
	if err != nil {
		return res, 0, false, err
	}
	if fence.Compare(ver) >= 0 {
		n, err := rows(io.Discard, false)
		res.Suppressed = n
		t.Result.Add(res)
		return res, n, false, err
	}
	// The lock the COPY takes anyway, taken first: an ALTER TABLE of another process (RestoreKey,
	// which drops the defaults) then waits for this transaction, so the defaults read below are
	// the ones the COPY meets.
	if _, err := t.tx.Exec(ctx, "lock table "+tab.Quoted()+" in row exclusive mode"); err != nil {
		return res, 0, false, fmt.Errorf("lock %s for its copy: %w", tab, err)
	}
	bulk, err := bulkDefaults(ctx, t.tx, tab, ver)
	if err != nil {
		return res, 0, false, err
	}
	binary := false
	if bulk {
		if binary, err = binaryOK(ctx, t.tx, tab, sourceMajor); err != nil {
			return res, 0, false, err
		}
	}
	pr, pw := io.Pipe()
	read := make(chan error, 1)
	go func() {
		var out interface {
			io.Writer
			Flush() error
		}
		if bulk {
			out = &passThrough{w: bufio.NewWriterSize(pw, copyThroughBuffer)}
		} else {
			out = &versionedLines{w: bufio.NewWriterSize(pw, copyThroughBuffer), suffix: []byte("\t" + ver.LSN.String() + "\t0\tf\t\\N\n")}
		}
		var err error
		n, err = rows(out, binary)
		if err == nil {
			err = out.Flush()
		}
		pw.CloseWithError(err) // nil: the COPY sees the end of its data
		read <- err
	}()
	cols := copyColumns(tab)
	if bulk {
		cols = cols[:len(tab.Columns)]
	}
	sql := "copy " + tab.Quoted() + " (" + strings.Join(cols, ", ") + ") from stdin"
	if binary {
		sql += " with (format binary)"
	}
	tag, err := t.tx.Conn().PgConn().CopyFrom(ctx, pr, sql)
	pr.CloseWithError(errCopyEnded) // a reader still writing drops the rest (versionedLines)
	readErr := <-read
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation:
		return res, n, true, nil
	case readErr != nil && !errors.Is(readErr, errCopyEnded):
		return res, n, false, readErr
	case err != nil:
		return res, n, false, fmt.Errorf("copy %d rows into %s: %w", n, tab, withCopyContext(err))
	case readErr != nil:
		return res, n, false, readErr
	case tag.RowsAffected() != n:
		return res, n, false, fmt.Errorf("copy into %s stored %d rows of the %d read", tab, tag.RowsAffected(), n)
	}
	res.Applied = n
	t.Result.Add(res)
	return res, n, false, nil
}

// errCopyEnded ends the writes of CopySnapshotRows's reader once the COPY has ended.
var errCopyEnded = errors.New("copy ended")

// versionedLines appends suffix (the version columns and the line's end) to every line written
// through it. After its writer failed (the COPY ended), it drops what it is given and reports
// success, so that the source's COPY is read to its end rather than broken off, which would close
// the source connection.
type versionedLines struct {
	w      *bufio.Writer
	suffix []byte
	err    error
}

// Write passes p on with suffix in place of each line end; it always reports all of p written.
func (l *versionedLines) Write(p []byte) (int, error) {
	for rest := p; len(rest) > 0 && l.err == nil; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			_, l.err = l.w.Write(rest)
			break
		}
		l.w.Write(rest[:i]) // a bufio.Writer's error sticks: the next Write reports it
		_, l.err = l.w.Write(l.suffix)
		rest = rest[i+1:]
	}
	return len(p), nil
}

// Flush writes what the buffer holds, unless a write failed before.
func (l *versionedLines) Flush() error {
	if l.err == nil {
		l.err = l.w.Flush()
	}
	return l.err
}

// passThrough passes the source's COPY output on unchanged. Like versionedLines, after its writer
// failed it drops what it is given and reports success.
type passThrough struct {
	w   *bufio.Writer
	err error
}

// Write passes p on; it always reports all of p written.
func (p *passThrough) Write(b []byte) (int, error) {
	if p.err == nil {
		_, p.err = p.w.Write(b)
	}
	return len(b), nil
}

// Flush writes what the buffer holds, unless a write failed before.
func (p *passThrough) Flush() error {
	if p.err == nil {
		p.err = p.w.Flush()
	}
	return p.err
}

// binaryOK reports whether the rows of tab can pass from a source of major version sourceMajor
// into the target in COPY's binary format (PostgreSQL docs, COPY, "Binary
// Format"): both servers are of one major version, and every column has the same type on both
// sides, one of binaryTypes or an array of one. Those are built-in types (the same OIDs in every
// database of a version) whose binary form names no other object and takes back every value the
// source sends; an array's form names its element type, built in too. Other types are copied as
// text: the reg* types, whose binary form is an OID of the source's catalog where the text form
// names the object; int2vector and oidvector, whose receive functions refuse an empty value;
// aclitem, which has no binary form; enums, domains and extensions' types.
func binaryOK(ctx context.Context, tx pgx.Tx, tab changebatch.Table, sourceMajor int) (bool, error) {
	if sourceMajor == 0 || sourceMajor != pgsession.MajorVersion(tx.Conn().PgConn()) {
		return false, nil
	}
	names := make([]string, len(tab.Columns))
	oids := make([]uint32, len(tab.Columns))
	for i, c := range tab.Columns {
		names[i], oids[i] = c.Name, c.TypeOID
	}
	var ok bool
	err := tx.QueryRow(ctx, `select count(*) = cardinality($2::text[]) from unnest($2::text[], $3::oid[]) c(name, typ)
join pg_attribute a on a.attrelid = $1::regclass and a.attname = c.name and not a.attisdropped and a.atttypid = c.typ
where c.typ = any($4::oid[]) or exists (select from pg_type e where e.typarray = c.typ and e.oid = any($4::oid[]))`,
		tab.Quoted(), names, oids, binaryTypes).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("compare the column types of target table %s: %w", tab, err)
	}
	return ok, nil
}

// binaryTypes are the OIDs of the built-in types binaryOK copies in binary format: bool, bytea,
// "char", name, int8, int2, int4, text, oid, json, point, lseg, path, box, polygon, line, float4,
// float8, circle, money, macaddr, cidr, inet, macaddr8, bpchar, varchar, date, time, timestamp,
// timestamptz, interval, timetz, bit, varbit, numeric, uuid, pg_lsn, jsonb and the ranges of
// int4, num, ts, tstz, date and int8 (pg_type.dat of PostgreSQL's source; stable across
// versions).
var binaryTypes = []uint32{16, 17, 18, 19, 20, 21, 23, 25, 26, 114, 600, 601, 602, 603, 604, 628, 700, 701, 718,
	790, 829, 650, 869, 774, 1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266, 1560, 1562, 1700, 2950, 3220, 3802,
	3904, 3906, 3908, 3910, 3912, 3926}
