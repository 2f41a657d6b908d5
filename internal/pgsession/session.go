// Package pgsession opens the connections every part of pgconverge uses, with the session settings
// that make text values exact and independent of server defaults, and holds the replication
// calls both producers need: opening a replication connection and creating a logical slot that
// exports its snapshot (PostgreSQL docs §55.4 "Streaming Replication Protocol",
// CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT).
package pgsession

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// params are the session settings of every connection: values travel as text between source and
// target, so both sides print and parse them the same way whatever the servers' defaults are
// (PostgreSQL docs §20.11 "Client Connection Defaults"), commits wait for their WAL flush
// whatever synchronous_commit the server defaults to (§20.5.1), and sessions idle in a
// transaction are not ended by the server (§20.11.1).
var params = map[string]string{
	"application_name":   "pgconverge",
	"DateStyle":          "ISO, YMD",
	"IntervalStyle":      "postgres",
	"TimeZone":           "UTC",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
	// money prints and parses with lc_monetary's symbol and fractional digits: the same locale on
	// both sides keeps its stored value exact whatever the servers' locales are.
	"lc_monetary": "C",
	// Text travels as UTF-8 whatever the databases' encodings (the server converts both ways and
	// refuses a character the target's encoding cannot hold), XML values are parsed as content
	// (documents and fragments alike), and an unquoted NULL in an array literal is a NULL element.
	"client_encoding": "UTF8",
	"xmloption":       "content",
	"array_nulls":     "on",
	// Backslashes in string literals pgconverge builds are plain characters.
	"standard_conforming_strings": "on",
	// A target commit must be durable before its position is confirmed to the source.
	"synchronous_commit": "on",
	// An exported snapshot lives in a session that stays idle in its transaction for a whole
	// backfill, and chunk readers wait in theirs for the target: a server default that ends such
	// sessions (common on managed services) would break every long backfill.
	"idle_in_transaction_session_timeout": "0",
	// A database or role default (ALTER DATABASE/ROLE … SET) must not cancel pgconverge's work:
	// a chunk's COPY or a whole table's fence runs long (statement_timeout), a lock another
	// session holds is waited for (lock_timeout; PostgreSQL reports the wait in pg_locks and the
	// stream's lag shows it), and connections idle between a daemon's checks stay open
	// (idle_session_timeout).
	"statement_timeout":    "0",
	"lock_timeout":         "0",
	"idle_session_timeout": "0",
	// Transactions are read committed unless pgconverge asks for more (backfill snapshots are
	// repeatable read), and may write.
	"default_transaction_isolation": "read committed",
	"default_transaction_read_only": "off",
	// Names resolve as with the server's default search path, whatever a database or role sets.
	"search_path": `"$user", public`,
	// A row-level security policy that would hide rows from a backfill read is an error, never
	// a silently smaller copy (PostgreSQL docs §5.8: row_security = off errors instead).
	"row_security": "off",
}

// setParams gives cfg pgconverge's session settings (params), and a connect timeout of
// DefaultConnectTimeout when its URL sets none (connect_timeout).
func setParams(cfg *pgconn.Config) {
	for k, v := range params {
		cfg.RuntimeParams[k] = v
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
}

// DefaultConnectTimeout bounds opening a connection (TCP, TLS and the startup exchange) whose URL
// sets no connect_timeout: a server or network that accepts the TCP connection and then answers
// nothing (a frozen host, a half-open proxy) would otherwise hold the caller forever.
const DefaultConnectTimeout = 30 * time.Second

// Connect opens an ordinary SQL connection to url with pgconverge's session settings. role names
// the side ("source" or "target") in errors; a failed connection is a *ConnectError. Opening it
// under a context of Deadline.Bound is bounded by that deadline, and so is each statement the
// connection runs under such a context.
func Connect(ctx context.Context, url, role string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse %s URL: %w", role, err)
	}
	setParams(&cfg.Config)
	cfg.Tracer = tracer{role: role}
	ctx, end := Call(ctx, role)
	defer end()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, &ConnectError{Role: role, Addr: fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database), User: cfg.User, err: err}
	}
	return conn, nil
}

// ConnectReplication opens a logical replication connection (replication=database) to the
// database of url; under a context of Deadline.Bound, within that deadline.
func ConnectReplication(ctx context.Context, url string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse source URL: %w", err)
	}
	setParams(cfg)
	cfg.RuntimeParams["replication"] = "database"
	ctx, end := Call(ctx, "source")
	defer end()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, &ConnectError{Role: "source", Addr: fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database), User: cfg.User,
			Needs: "a replication connection: the role needs the REPLICATION attribute and a pg_hba.conf entry that allows it", err: err}
	}
	return conn, nil
}

// Slot is a logical slot just created with an exported snapshot.
type Slot struct {
	Name string
	// ConsistentPoint is the snapshot LSN S: the exported snapshot shows exactly the
	// transactions whose commit LSN is below it, and the slot streams every later one.
	ConsistentPoint pglogrepl.LSN
	// SnapshotName can be imported with SET TRANSACTION SNAPSHOT while the creating connection
	// stays open and runs no other command.
	SnapshotName string
}

// CreateSlot creates logical slot name (plugin pgoutput) on the replication connection conn and
// exports its snapshot. A temporary slot disappears when conn closes. A failover slot (PostgreSQL
// 17 and later only: the caller checks the version) is synchronized to the physical standbys that
// sync replication slots, so a promoted standby can continue it (PostgreSQL 17 docs §47.2.3
// "Replication Slot Synchronization", §53.4 CREATE_REPLICATION_SLOT … FAILOVER); temporary slots
// cannot be failover slots. name must already be valid.
func CreateSlot(ctx context.Context, conn *pgconn.PgConn, name string, temporary, failover bool) (Slot, error) {
	var res pglogrepl.CreateReplicationSlotResult
	var err error
	if failover {
		if temporary {
			return Slot{}, fmt.Errorf("create replication slot %q: a temporary slot cannot be a failover slot", name)
		}
		// The option list syntax of PostgreSQL 15 and later: FAILOVER has no
		// keyword form, and pglogrepl sends only the keyword form.
		res, err = pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx,
			fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)", name)))
	} else {
		res, err = pglogrepl.CreateReplicationSlot(ctx, conn, name, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
			Temporary: temporary, SnapshotAction: "EXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication,
		})
	}
	if err != nil {
		return Slot{}, fmt.Errorf("create replication slot %q: %w", name, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return Slot{}, fmt.Errorf("create replication slot %q: consistent point %q: %w", name, res.ConsistentPoint, err)
	}
	return Slot{Name: res.SlotName, ConsistentPoint: lsn, SnapshotName: res.SnapshotName}, nil
}

// SetSlotFailover sets the failover property of the existing logical slot name on the replication
// connection conn (ALTER_REPLICATION_SLOT name (FAILOVER on), PostgreSQL 17 and later, PostgreSQL 17
// docs §53.4); the slot must not be in use. name must already be valid. Under a context of
// Deadline.Bound, within that deadline.
func SetSlotFailover(ctx context.Context, conn *pgconn.PgConn, name string, on bool) error {
	ctx, end := Call(ctx, "source")
	defer end()
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER %v)", name, on)).ReadAll(); err != nil {
		return fmt.Errorf("set failover = %v on replication slot %q (ALTER_REPLICATION_SLOT): %w", on, name, err)
	}
	return nil
}

// MajorVersion returns the major version of the server c is connected to, from the
// server_version it reports at startup (such as "15.18 (Debian 15.18-0+deb12u1)" or "17beta1":
// its leading digits), 0 when it reports none.
func MajorVersion(c *pgconn.PgConn) int {
	v := c.ParameterStatus("server_version")
	n := 0
	for i := 0; i < len(v) && v[i] >= '0' && v[i] <= '9'; i++ {
		n = n*10 + int(v[i]-'0')
	}
	return n
}
