package backfill

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// Snapshot names an exported snapshot and its exact LSN S.
type Snapshot struct {
	// Name is the exported snapshot's id, for SET TRANSACTION SNAPSHOT.
	Name string
	// LSN is S: the snapshot shows exactly the transactions whose commit LSN is below it.
	LSN pglogrepl.LSN
}

// snapshotName matches the ids pg_export_snapshot and EXPORT_SNAPSHOT return, for example
// 00000003-0000001B-1; it is spliced into SET TRANSACTION SNAPSHOT, which takes no parameters.
var snapshotName = regexp.MustCompile(`^[0-9A-Fa-f]+(-[0-9A-Fa-f]+)+$`)

// Exported is a snapshot held open by a temporary slot on its own replication connection. The
// snapshot stays importable until Close.
type Exported struct {
	Snapshot
	conn *pgconn.PgConn
}

// Export creates a temporary logical slot with an exported snapshot on a new replication
// connection to sourceURL. Close drops the slot and releases the snapshot. When sourceURL is a
// standby (PostgreSQL 16 and later), primaryURL names its primary, on which
// pg_log_standby_snapshot() is called while the slot is created (pgsession.LogStandbySnapshots);
// "" waits for the primary's own records. The standby's snapshot is as exact as a primary's: the
// slot's snapshot builder reads the same WAL. A creation that waits for transactions open on the
// source is reported to waits (pgsession.WatchSlotCreation; nil: not reported).
func Export(ctx context.Context, sourceURL, primaryURL string, waits func(pgsession.SlotWait)) (*Exported, error) {
	conn, err := pgsession.ConnectReplication(ctx, sourceURL)
	if err != nil {
		return nil, err
	}
	name := "pgconverge_snap_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if primaryURL != "" {
		if primaryURL, err = primaryIfStandby(ctx, conn, primaryURL); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("export snapshot: %w", err)
		}
	}
	stop := pgsession.LogStandbySnapshots(ctx, primaryURL)
	unwatch := pgsession.WatchSlotCreation(ctx, sourceURL, name, conn.PID(), waits)
	slot, err := pgsession.CreateSlot(ctx, conn, name, true, false)
	unwatch()
	stop()
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("export snapshot: %w", err)
	}
	return &Exported{Snapshot: Snapshot{Name: slot.SnapshotName, LSN: slot.ConsistentPoint}, conn: conn}, nil
}

// Close ends the replication connection, which drops the temporary slot and the snapshot.
func (e *Exported) Close(ctx context.Context) error { return e.conn.Close(ctx) }

// primaryIfStandby returns primaryURL when the server of the replication connection conn is in
// recovery, "" when it is a primary (a standby promoted since, say).
func primaryIfStandby(ctx context.Context, conn *pgconn.PgConn, primaryURL string) (string, error) {
	res, err := conn.Exec(ctx, "select pg_is_in_recovery()").ReadAll()
	if err != nil {
		return "", fmt.Errorf("read whether the source is in recovery: %w", err)
	}
	if len(res) == 1 && len(res[0].Rows) == 1 && string(res[0].Rows[0][0]) == "t" {
		return primaryURL, nil
	}
	return "", nil
}
