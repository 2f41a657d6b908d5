package apply

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// deferredTx is a pgx.Tx whose BEGIN is not a round trip of its own: it is sent with the
// transaction's first statement, in the same pipeline when that is a batch (pgx.Batch.BeginTx),
// so a stream group of small source transactions costs the target two round trips (BEGIN,
// fences, progress and merges pipelined; COMMIT), not three. Once begun it is the pgx.Tx that pgx
// began; a transaction that sent nothing commits and rolls back without a round trip.
type deferredTx struct {
	conn *pgx.Conn
	// tx is the transaction once BEGIN was sent, nil before.
	tx pgx.Tx
	// closed is set by a Commit or Rollback before anything was sent.
	closed bool
}

var _ pgx.Tx = (*deferredTx)(nil)

// start sends BEGIN on its own unless it was sent; pgx.ErrTxClosed after a Commit or Rollback
// that came first.
func (d *deferredTx) start(ctx context.Context) error {
	if d.tx != nil {
		return nil
	}
	if d.closed {
		return pgx.ErrTxClosed
	}
	tx, err := d.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin target transaction: %w", err)
	}
	d.tx = tx
	return nil
}

// Begin starts a savepoint (pgx.Tx.Begin), sending the transaction's BEGIN first if it was not.
func (d *deferredTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	return d.tx.Begin(ctx)
}

// Commit commits as pgx.Tx.Commit does; without a round trip when nothing was sent.
func (d *deferredTx) Commit(ctx context.Context) error {
	if d.tx == nil {
		return d.close()
	}
	return d.tx.Commit(ctx)
}

// Rollback rolls back as pgx.Tx.Rollback does; without a round trip when nothing was sent.
func (d *deferredTx) Rollback(ctx context.Context) error {
	if d.tx == nil {
		return d.close()
	}
	return d.tx.Rollback(ctx)
}

// close ends a transaction that sent nothing: pgx.ErrTxClosed when it was ended before.
func (d *deferredTx) close() error {
	if d.closed {
		return pgx.ErrTxClosed
	}
	d.closed = true
	return nil
}

// CopyFrom runs pgx.Tx.CopyFrom.
func (d *deferredTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := d.start(ctx); err != nil {
		return 0, err
	}
	return d.tx.CopyFrom(ctx, table, cols, src)
}

// SendBatch sends b in the transaction. The first batch of the transaction carries its BEGIN
// ahead of b's statements (pgx.Batch.BeginTx), whose result it reads, so that the results the
// caller reads are b's alone.
func (d *deferredTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if d.closed {
		return failedBatch{pgx.ErrTxClosed}
	}
	if d.tx != nil {
		return d.tx.SendBatch(ctx, b)
	}
	withBegin := &pgx.Batch{}
	withBegin.BeginTx(pgx.TxOptions{})
	withBegin.QueuedQueries = append(withBegin.QueuedQueries, b.QueuedQueries...)
	br := d.conn.SendBatch(ctx, withBegin)
	d.tx = br.Tx()
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return failedBatch{fmt.Errorf("begin target transaction: %w", err)}
	}
	return br
}

// LargeObjects returns pgx.Tx.LargeObjects once the transaction began, the zero value (unusable)
// before: the apply step uses no large objects.
func (d *deferredTx) LargeObjects() pgx.LargeObjects {
	if d.tx == nil {
		return pgx.LargeObjects{}
	}
	return d.tx.LargeObjects()
}

// Prepare runs pgx.Tx.Prepare.
func (d *deferredTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	return d.tx.Prepare(ctx, name, sql)
}

// Exec runs pgx.Tx.Exec.
func (d *deferredTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := d.start(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return d.tx.Exec(ctx, sql, args...)
}

// Query runs pgx.Tx.Query.
func (d *deferredTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	return d.tx.Query(ctx, sql, args...)
}

// QueryRow runs pgx.Tx.QueryRow.
func (d *deferredTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := d.start(ctx); err != nil {
		return failedRow{err}
	}
	return d.tx.QueryRow(ctx, sql, args...)
}

// Conn returns the connection. A caller that uses it directly (PgConn().CopyFrom) calls
// Tx.pgConn instead, which sends BEGIN first.
func (d *deferredTx) Conn() *pgx.Conn { return d.conn }

// failedBatch is the pgx.BatchResults of a batch that could not run: every read returns err.
type failedBatch struct{ err error }

func (f failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, f.err }
func (f failedBatch) Query() (pgx.Rows, error)         { return nil, f.err }
func (f failedBatch) QueryRow() pgx.Row                { return failedRow(f) }
func (f failedBatch) Close() error                     { return f.err }
func (f failedBatch) Tx() pgx.Tx                       { return nil }

// failedRow is the pgx.Row of a query that could not run: Scan returns err.
type failedRow struct{ err error }

func (f failedRow) Scan(...any) error { return f.err }
