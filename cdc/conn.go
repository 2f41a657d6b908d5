package cdc

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// replicationConn is what the receive loop does with a replication connection in streaming mode
// (after START_REPLICATION): receive the server's messages under a read deadline, and send standby
// status updates. Run uses a *pgconn.PgConn (pgReplicationConn); the loop's tests use a fake
// server in memory.
type replicationConn interface {
	// ReceiveMessage returns the next message from the server. When the read deadline passes
	// first it returns an error for which receiveTimedOut reports true, and the connection stays
	// usable.
	ReceiveMessage(ctx context.Context) (pgproto3.BackendMessage, error)
	// SendStandbyStatusUpdate sends one standby status update (PostgreSQL docs §55.4).
	SendStandbyStatusUpdate(ctx context.Context, u pglogrepl.StandbyStatusUpdate) error
	// SetReadDeadline sets when a ReceiveMessage under way, or the next one, gives up; a time
	// already passed makes it give up at once, and the zero time never. Safe to call from any
	// goroutine.
	SetReadDeadline(t time.Time) error
}

// receiveTimedOut reports whether err from replicationConn.ReceiveMessage means the read deadline
// passed: pgconn reports that as a timeout, a net.Conn as os.ErrDeadlineExceeded.
func receiveTimedOut(err error) bool {
	return pgconn.Timeout(err) || errors.Is(err, os.ErrDeadlineExceeded)
}

// pgReplicationConn is a replicationConn over a pgconn connection in streaming mode.
type pgReplicationConn struct{ conn *pgconn.PgConn }

func (c pgReplicationConn) ReceiveMessage(ctx context.Context) (pgproto3.BackendMessage, error) {
	return c.conn.ReceiveMessage(ctx)
}

func (c pgReplicationConn) SendStandbyStatusUpdate(ctx context.Context, u pglogrepl.StandbyStatusUpdate) error {
	return pglogrepl.SendStandbyStatusUpdate(ctx, c.conn, u)
}

func (c pgReplicationConn) SetReadDeadline(t time.Time) error {
	return c.conn.Conn().SetReadDeadline(t)
}
