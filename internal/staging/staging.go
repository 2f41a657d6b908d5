// Package staging keeps the pgoutput messages of transactions the source streams before their
// commit in a table of the target (pgconverge.stream_staging), for the stream to apply at their
// commit (cdc.Stager).
//
// Invariant: what a transaction staged is read back exactly as it was staged, in order, and
// nothing of it is visible in the replicated tables before its commit is applied; an abort deletes
// exactly what the transaction, or the subtransaction, staged (PostgreSQL docs §55.5 "Logical
// Streaming Replication Protocol").
package staging

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/cdc"
)

// Table is the staging of one slot in pgconverge.stream_staging, over a target connection of its
// own that the stream's loop uses alone (one statement at a time).
type Table struct {
	conn *pgx.Conn
	slot string
}

// New returns slot's staging over conn, a target connection the caller closes.
func New(conn *pgx.Conn, slot string) *Table { return &Table{conn: conn, slot: slot} }

var _ cdc.Stager = (*Table)(nil)

// Clear deletes every row of the slot.
func (t *Table) Clear(ctx context.Context) error {
	if _, err := t.conn.Exec(ctx, `delete from pgconverge.stream_staging where slot = $1`, t.slot); err != nil {
		return fmt.Errorf("clear the stream staging of slot %q: %w", t.slot, err)
	}
	return nil
}

// Stage copies msgs into the table (COPY) in one statement.
func (t *Table) Stage(ctx context.Context, msgs []cdc.StagedMessage) error {
	i := 0
	_, err := t.conn.CopyFrom(ctx, pgx.Identifier{"pgconverge", "stream_staging"}, []string{"slot", "xid", "seq", "subxid", "kind", "data"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i == len(msgs) {
				return nil, nil
			}
			m := msgs[i]
			i++
			return []any{t.slot, int64(m.Xid), m.Seq, int64(m.SubXid), m.Data[0], m.Data}, nil
		}))
	if err != nil {
		return fmt.Errorf("copy %d messages into the stream staging of slot %q: %w", len(msgs), t.slot, err)
	}
	return nil
}

// DiscardSub deletes the row changes (Insert, Update, Delete, Truncate and logical decoding
// messages) subtransaction subXid of xid staged; Relation and Type messages stay, since the
// source counts them as sent for the whole transaction.
func (t *Table) DiscardSub(ctx context.Context, xid, subXid uint32) error {
	_, err := t.conn.Exec(ctx, `delete from pgconverge.stream_staging where slot = $1 and xid = $2 and subxid = $3 and kind not in ('R', 'Y')`,
		t.slot, int64(xid), int64(subXid))
	if err != nil {
		return fmt.Errorf("discard the staged changes of subtransaction %d of transaction %d (slot %q): %w", subXid, xid, t.slot, err)
	}
	return nil
}

// Discard deletes every row transaction xid staged.
func (t *Table) Discard(ctx context.Context, xid uint32) error {
	if _, err := t.conn.Exec(ctx, `delete from pgconverge.stream_staging where slot = $1 and xid = $2`, t.slot, int64(xid)); err != nil {
		return fmt.Errorf("discard the staged changes of transaction %d (slot %q): %w", xid, t.slot, err)
	}
	return nil
}

// Read returns up to limit messages of xid with seq above after, in seq order.
func (t *Table) Read(ctx context.Context, xid uint32, after int64, limit int) ([]cdc.StagedMessage, error) {
	rows, err := t.conn.Query(ctx, `select subxid, seq, data from pgconverge.stream_staging
where slot = $1 and xid = $2 and seq > $3 order by seq limit $4`, t.slot, int64(xid), after, limit)
	if err != nil {
		return nil, fmt.Errorf("read the stream staging of transaction %d (slot %q): %w", xid, t.slot, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cdc.StagedMessage, error) {
		m := cdc.StagedMessage{Xid: xid}
		var sub int64
		err := r.Scan(&sub, &m.Seq, &m.Data)
		m.SubXid = uint32(sub)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the stream staging of transaction %d (slot %q): %w", xid, t.slot, err)
	}
	return out, nil
}
