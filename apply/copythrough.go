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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// CopyRows writes snapshot rows of a table to w in COPY text format (PostgreSQL docs, COPY,
// "Text Format"): one line per row, the table's data columns in changebatch.Table.Columns order,
// as a source COPY TO prints them (backfill.CopyChunk). It returns how many rows it wrote.
type CopyRows func(w io.Writer) (int64, error)

// copyThroughBuffer is how many bytes of rows are gathered before they are handed to the target
// COPY (256 KiB): large enough that the two sides exchange few buffers, small enough to bound the
// memory of a copy.
const copyThroughBuffer = 256 << 10

// CopySnapshotRows writes the rows that rows writes, every one a snapshot row of tab at version
// ver (S, 0), with one COPY straight into the target table. The bytes are not parsed: each line
// only gets the version columns appended. It has the version rule's own outcome when the target
// holds none of the keys, checked against the table's fence first (locked FOR SHARE
// until the transaction ends; at or above ver, rows are read and counted as suppressed, and
// nothing is written). When the target holds one of the keys, the COPY fails with a unique
// violation and CopySnapshotRows returns conflict true; the transaction is then unusable, and the
// caller rolls it back and merges the rows instead. It returns how many rows rows wrote. rows
// runs in a goroutine of its own; after the target's COPY ended early it keeps reading and drops
// what it reads, so its source connection stays usable.
func (t *Tx) CopySnapshotRows(ctx context.Context, tab changebatch.Table, ver changebatch.Version, rows CopyRows) (res Result, n int64, conflict bool, err error) {
	if tab.Keyless || ver.Seq != 0 {
		return res, 0, false, fmt.Errorf("copy snapshot rows of %s at %s: only a keyed table's rows at a snapshot version (S, 0) can be copied", tab, ver)
	}
	fence, err := t.lockFence(ctx, tab)
	if err != nil {
		return res, 0, false, err
	}
	if fence.Compare(ver) >= 0 {
		n, err := rows(io.Discard)
		res.Suppressed = n
		t.Result.Add(res)
		return res, n, false, err
	}
	pr, pw := io.Pipe()
	read := make(chan error, 1)
	go func() {
		lines := &versionedLines{w: bufio.NewWriterSize(pw, copyThroughBuffer), suffix: []byte("\t" + ver.LSN.String() + "\t0\tf\t\\N\n")}
		var err error
		n, err = rows(lines)
		if err == nil && lines.err == nil {
			lines.err = lines.w.Flush()
		}
		pw.CloseWithError(err) // nil: the COPY sees the end of its data
		read <- err
	}()
	sql := "copy " + tab.Quoted() + " (" + strings.Join(copyColumns(tab), ", ") + ") from stdin"
	tag, err := t.tx.Conn().PgConn().CopyFrom(ctx, pr, sql)
	pr.CloseWithError(errCopyEnded) // a reader still writing drops the rest (versionedLines)
	readErr := <-read
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation:
		return res, n, true, nil
	case readErr != nil:
		return res, n, false, readErr
	case err != nil:
		return res, n, false, fmt.Errorf("copy %d rows into %s: %w", n, tab, withCopyContext(err))
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
