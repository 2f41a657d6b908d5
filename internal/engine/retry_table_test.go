package engine

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/disposition"
	"github.com/pgconverge/pgconverge/internal/overlap"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// dispositionCase is an error a session can end with and what the daemon makes of it.
type dispositionCase struct {
	name string
	err  error
}

// dispositionCases are the failures decide, reason and hint tell apart: every marked error alone,
// every SQLSTATE code and class of the server table, failed connections, and the combinations
// whose precedence matters (a deadline over everything, overlap and leadership reasons first,
// the server's hint before a lost slot's).
func dispositionCases() []dispositionCase {
	pg := func(code string) error { return fmt.Errorf("apply: %w", &pgconn.PgError{Code: code}) }
	timeout := func(role string) error { return &pgsession.TimeoutError{Role: role, Timeout: time.Minute} }
	fenced := &apply.FencedError{Slot: "s", Epoch: 1, Current: 2, Holder: "h"}
	schema := &cdc.SchemaChangeError{Table: changebatch.Table{TableName: changebatch.TableName{Schema: "public", Name: "t"}}, Added: []string{"c"}}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	connect := &pgconn.ConnectError{Config: &pgconn.Config{Host: "h", Port: 5432}}
	return []dispositionCase{
		// marked errors alone
		{"permanent", permanent(errors.New("no primary key"))},
		{"schema change", fmt.Errorf("stream: %w", schema)},
		{"watch", watchError{pg("XX000")}},
		{"watch without a server error", watchError{io.ErrUnexpectedEOF}},
		{"enum check", enumCheckError{pg("22P02")}},
		{"key lost", keyLostError{errors.New("table public.t has no primary key")}},
		{"overlap", fmt.Errorf("record coverage: %w", overlap.FollowedElsewhereError{})},
		{"membership changed", fmt.Errorf("%w for table public.t", errMembershipChanged)},
		{"slot moved", fmt.Errorf("%w: slot", errSlotMoved)},
		{"enum changed", fmt.Errorf("%w: %w", fmt.Errorf("%w: type e", errEnumChanged), pg("22P02"))},
		{"follower stopped", fmt.Errorf("%w: t", overlap.ErrFollowerStopped)},
		{"slot lost", fmt.Errorf("%w: (start replication: %w)", errSlotLost, &pgconn.PgError{Code: "55000"})},
		{"leadership lost", fmt.Errorf("%w: %w", errLeadershipLost, io.ErrUnexpectedEOF)},
		{"fenced", fmt.Errorf("write: %w", fenced)},
		{"slot busy", fmt.Errorf("prepare: %w", cdc.ErrSlotBusy)},
		{"slot missing", fmt.Errorf("start replication: %w: %w", cdc.ErrSlotMissing, &pgconn.PgError{Code: "42704"})},
		{"slot missing without a server error", fmt.Errorf("drop: %w", cdc.ErrSlotMissing)},
		{"source silent", fmt.Errorf("receive: %w: nothing", cdc.ErrSourceSilent)},
		{"rewritten", fmt.Errorf("read chunk: %w", backfill.ErrRewritten)},
		{"timeout source", fmt.Errorf("%w (%w)", timeout("source"), io.ErrUnexpectedEOF)},
		{"timeout target alone", timeout("target")},
		// the server's errors
		{"55006", pg("55006")}, {"55P03", pg("55P03")}, {"42P01", pg("42P01")}, {"42703", pg("42703")},
		{"25P03", pg("25P03")}, {"2BP01", fmt.Errorf("drop: %w", &pgconn.PgError{Code: "2BP01", Detail: "view v depends on column c"})},
		{"53100", pg("53100")}, {"53200", pg("53200")}, {"53300", pg("53300")},
		{"23505", pg("23505")}, {"23514", pg("23514")},
		{"23502 staging", fmt.Errorf("apply: %w", &pgconn.PgError{Code: "23502", TableName: "pgconverge_stage_1"})},
		{"08006", pg("08006")}, {"08P01", pg("08P01")}, {"40001", pg("40001")}, {"40P01", pg("40P01")},
		{"57P01", pg("57P01")}, {"57014", pg("57014")}, {"58030", pg("58030")}, {"XX000", pg("XX000")},
		{"22P02", pg("22P02")}, {"42704", pg("42704")}, {"42501", pg("42501")}, {"21000", pg("21000")},
		{"28P01", pg("28P01")}, {"0A000", pg("0A000")}, {"55000", pg("55000")},
		// connections
		{"EOF", fmt.Errorf("receive: %w", io.EOF)},
		{"unexpected EOF", fmt.Errorf("receive: %w", io.ErrUnexpectedEOF)},
		{"reset", fmt.Errorf("read: %w", reset)},
		{"closed", fmt.Errorf("read: %w", net.ErrClosed)},
		{"conn closed", fmt.Errorf("read: %w", pgconn.ErrConnClosed)},
		{"connect", connect},
		{"connect to a server that refused", fmt.Errorf("connect: %w", &pgconn.ConnectError{Config: &pgconn.Config{}})},
		{"our own decoding error", errors.New("pgoutput: Commit does not match")},
		{"publication missing", fmt.Errorf("stream: %w: %w", cdc.ErrPublicationMissing, &pgconn.PgError{Code: "42704"})},
		// combinations
		{"timeout, then permanent", fmt.Errorf("%w (%w)", timeout("target"), permanent(errors.New("check")))},
		{"permanent over timeout", permanent(fmt.Errorf("check: %w", timeout("target")))},
		{"timeout, then overlap", fmt.Errorf("%w (%w)", timeout("target"), overlap.FollowedElsewhereError{})},
		{"timeout, then fenced", fmt.Errorf("%w (%w)", timeout("target"), fenced)},
		{"fenced over timeout", fmt.Errorf("%w; the session ended with: %w", fenced, fmt.Errorf("%w (%w)", timeout("source"), io.EOF))},
		{"timeout, then slot moved", fmt.Errorf("%w (%w)", timeout("source"), errSlotMoved)},
		{"timeout, then enum changed", fmt.Errorf("%w (%w)", timeout("source"), errEnumChanged)},
		{"timeout, then 23505", fmt.Errorf("%w (%w)", timeout("target"), pg("23505"))},
		{"timeout, then slot lost", fmt.Errorf("%w (%w)", timeout("source"), errSlotLost)},
		{"fenced over overlap", fmt.Errorf("%w; the session ended with: %w", fenced, overlap.FollowedElsewhereError{})},
		{"fenced over 23505", fmt.Errorf("%w; the session ended with: %w", fenced, pg("23505"))},
		{"fenced over permanent", fmt.Errorf("%w; the session ended with: %w", fenced, permanent(errors.New("check")))},
		{"leadership lost over schema change", fmt.Errorf("%w: %w", errLeadershipLost, schema)},
		{"slot lost over 23505", fmt.Errorf("%w: (%w)", errSlotLost, pg("23505"))},
		{"slot lost over 55006", fmt.Errorf("%w: (%w)", errSlotLost, pg("55006"))},
		{"slot lost over 55P03", fmt.Errorf("%w: (%w)", errSlotLost, pg("55P03"))},
		{"slot lost over 53100", fmt.Errorf("%w: (%w)", errSlotLost, pg("53100"))},
		{"slot lost over source silent", fmt.Errorf("%w: (%w)", errSlotLost, cdc.ErrSourceSilent)},
		{"slot lost over overlap", fmt.Errorf("%w: (%w)", errSlotLost, overlap.FollowedElsewhereError{})},
		{"slot moved over 23505", fmt.Errorf("%w: (%w)", errSlotMoved, pg("23505"))},
		{"slot moved over slot lost", fmt.Errorf("%w: (%w)", errSlotMoved, errSlotLost)},
		{"slot moved over permanent", fmt.Errorf("%w: (%w)", errSlotMoved, permanent(errors.New("x")))},
		{"watch over 55P03", watchError{pg("55P03")}},
		{"watch over 55006", watchError{pg("55006")}},
		{"watch over slot busy", watchError{cdc.ErrSlotBusy}},
		{"key lost over 23505", keyLostError{errors.Join(errors.New("no key"), pg("23505"))}},
		{"key lost over 55006", keyLostError{errors.Join(errors.New("no key"), pg("55006"))}},
		{"enum check over 23505", enumCheckError{pg("23505")}},
		{"slot busy over 55P03", fmt.Errorf("%w: %w", cdc.ErrSlotBusy, pg("55P03"))},
		{"slot busy over slot lost", fmt.Errorf("%w: %w", cdc.ErrSlotBusy, errSlotLost)},
		{"slot missing over 23505", fmt.Errorf("%w: %w", cdc.ErrSlotMissing, pg("23505"))},
		{"rewritten over 55006", fmt.Errorf("%w: %w", backfill.ErrRewritten, pg("55006"))},
		{"rewritten over 55P03", fmt.Errorf("%w: %w", backfill.ErrRewritten, pg("55P03"))},
		{"source silent over 53100", fmt.Errorf("%w: %w", cdc.ErrSourceSilent, pg("53100"))},
		{"source silent over connect", fmt.Errorf("%w: %w", cdc.ErrSourceSilent, connect)},
		{"permanent over schema change", permanent(schema)},
		{"permanent over slot lost", permanent(errSlotLost)},
		{"membership changed over overlap", fmt.Errorf("%w: %w", errMembershipChanged, overlap.FollowedElsewhereError{})},
		{"connect and 28P01", errors.Join(connect, pg("28P01"))},
		{"joined refusal and EOF", errors.Join(errors.New("table a has no key"), io.ErrUnexpectedEOF)},
		{"joined 23505 and 55006", errors.Join(pg("23505"), pg("55006"))},
		{"two server errors, lock first", fmt.Errorf("%w: %w", pg("55P03"), pg("42P01"))},
	}
}

// TestDispositionTable pins decide, reason and hint for each failure (dispositionCases).
func TestDispositionTable(t *testing.T) {
	want := dispositionWant()
	for _, c := range dispositionCases() {
		got := outcome(c.err)
		if w, ok := want[c.name]; !ok {
			t.Errorf("%q: no expected outcome; got %q", c.name, got)
		} else if got != w {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, w)
		}
	}
}

// outcome is decide's, reason's and hint's answers for err in one line; only decide's for an
// error the daemon stops with, since it reads reason and hint only for those it retries.
func outcome(err error) string {
	d := "stop"
	switch decide(err) {
	case backOff:
		d = "backOff"
	case restart:
		d = "restart"
	default:
		return d
	}
	return d + " | " + reason(err) + " | " + hint(err)
}

// dispositionWant is the outcome of each of dispositionCases, as decide, reason and hint gave it
// before errors carried their marks (internal/disposition).
func dispositionWant() map[string]string {
	const (
		enumChanged   = "an enum label was added or renamed on the source: the next session changes the target's type alike"
		slotLost      = "the source removed WAL the slot still needed because it held more than max_slot_wal_keep_size (a load, or a lag, longer than the source keeps WAL for): raise max_slot_wal_keep_size on the source (ALTER SYSTEM SET max_slot_wal_keep_size = '…'; -1 keeps all), or it happens again at the next load; the next session creates the slot anew and backfills what was not streamed"
		silent        = "the replication connection went silent without an error (a network dropping packets, a hung server or proxy): the daemon reconnects; check the network between this host and the source"
		timeoutSource = "the source stopped answering behind an open connection (a frozen host or proxy, or a network that drops packets, which TCP keepalives do not notice while the peer's kernel still acknowledges), or a statement waited that long for a lock (pg_locks on the source shows who holds it): the daemon reconnects; check the network between this host and the source"
		timeoutTarget = "the target stopped answering behind an open connection (a frozen host or proxy, or a network that drops packets, which TCP keepalives do not notice while the peer's kernel still acknowledges), or a statement waited that long for a lock (pg_locks on the target shows who holds it): the daemon reconnects; check the network between this host and the target"
		slotBusy      = "another process holds the replication slot: a second pgconverge with the same --slot, or the walsender of a killed one that the source has not noticed yet (then it frees the slot within wal_sender_timeout)"
		lock          = "a lock held by another session was not granted in time: the daemon retries; pg_locks on that server shows who holds it"
		tableMissing  = "a table is missing; if a target table was dropped, the next session recreates and reloads it"
		columnGone    = "a column was dropped or renamed on the source while it was read: the next session describes the table again"
		dependents    = "objects on the target (view v depends on column c) depend on a target column, table or live view that pgconverge must drop to follow a change of the source (most likely a column the source dropped and added again): drop or change them; the daemon retries meanwhile"
		diskFull      = "a disk of the server that reported it is full (the error names the file): free space or grow the filesystem there; nothing was committed from the failed transaction, and the daemon retries the same changes until it succeeds"
		resources     = "the server that reported it lacks a resource (memory, connections, disk): the error names it; the daemon retries the same changes"
		constraint    = "a constraint of the target table rejects a row of the source (the error names the constraint and the row): change or drop that constraint on the target; the daemon retries the same changes until then and never skips them"
		staging       = "pgconverge's staging copy of a target table refused a row, most likely a change of the source without a value for a key column; this is no constraint of yours: report it with this log line, the daemon retries meanwhile"
		connect       = "check that the server is running and that the URL's host, port and database are right"
	)
	return map[string]string{
		"permanent":                           "stop",
		"schema change":                       "restart | restart | ",
		"watch":                               "backOff | watch | ",
		"watch without a server error":        "backOff | watch | ",
		"enum check":                          "backOff | other | ",
		"key lost":                            "backOff | schema | ",
		"overlap":                             "backOff | overlap | ",
		"membership changed":                  "restart | restart | ",
		"slot moved":                          "restart | restart | ",
		"enum changed":                        "restart | restart | " + enumChanged,
		"follower stopped":                    "restart | restart | ",
		"slot lost":                           "backOff | slot-lost | " + slotLost,
		"leadership lost":                     "restart | leadership | ",
		"fenced":                              "restart | leadership | ",
		"slot busy":                           "backOff | slot-busy | ",
		"slot missing":                        "backOff | other | ",
		"slot missing without a server error": "backOff | connection | ",
		"source silent":                       "backOff | connection | " + silent,
		"rewritten":                           "backOff | schema | ",
		"timeout source":                      "backOff | timeout | " + timeoutSource,
		"timeout target alone":                "backOff | timeout | " + timeoutTarget,
		"55006":                               "backOff | slot-busy | " + slotBusy,
		"55P03":                               "backOff | lock | " + lock,
		"42P01":                               "backOff | schema | " + tableMissing,
		"42703":                               "backOff | schema | " + columnGone,
		"25P03":                               "backOff | other | ",
		"2BP01":                               "backOff | schema | " + dependents,
		"53100":                               "backOff | resources | " + diskFull,
		"53200":                               "backOff | resources | " + resources,
		"53300":                               "backOff | resources | " + resources,
		"23505":                               "backOff | constraint | " + constraint,
		"23514":                               "backOff | constraint | " + constraint,
		"23502 staging":                       "backOff | constraint | " + staging,
		"08006":                               "backOff | connection | ",
		"08P01":                               "backOff | connection | ",
		"40001":                               "backOff | conflict | a serialization failure: on a standby source, the standby cancelled a read that held back its replay of the primary's WAL longer than max_standby_streaming_delay (a lock or a VACUUM on the primary); the daemon retries and a backfill resumes from its last chunk; for long loads raise max_standby_streaming_delay on the standby",
		"40P01":                               "backOff | conflict | ",
		"57P01":                               "backOff | connection | ",
		"57014":                               "backOff | connection | ",
		"58030":                               "backOff | other | ",
		"XX000":                               "stop",
		"22P02":                               "stop",
		"42704":                               "stop",
		"42501":                               "stop",
		"21000":                               "stop",
		"28P01":                               "stop",
		"0A000":                               "stop",
		"55000":                               "stop",
		"EOF":                                 "backOff | connection | ",
		"unexpected EOF":                      "backOff | connection | ",
		"reset":                               "backOff | connection | ",
		"closed":                              "backOff | connection | ",
		"conn closed":                         "backOff | connection | ",
		"connect":                             "backOff | connection | " + connect,
		"connect to a server that refused":    "backOff | connection | " + connect,
		"our own decoding error":              "stop",
		"publication missing":                 "stop",
		"timeout, then permanent":             "backOff | timeout | " + timeoutTarget,
		"permanent over timeout":              "backOff | timeout | " + timeoutTarget,
		"timeout, then overlap":               "backOff | overlap | " + timeoutTarget,
		"timeout, then fenced":                "backOff | leadership | " + timeoutTarget,
		"fenced over timeout":                 "backOff | leadership | " + timeoutSource,
		"timeout, then slot moved":            "backOff | timeout | " + timeoutSource,
		"timeout, then enum changed":          "backOff | timeout | " + timeoutSource,
		"timeout, then 23505":                 "backOff | timeout | " + timeoutTarget,
		"timeout, then slot lost":             "backOff | timeout | " + timeoutSource,
		"fenced over overlap":                 "restart | overlap | ",
		"fenced over 23505":                   "restart | leadership | " + constraint,
		"fenced over permanent":               "stop",
		"leadership lost over schema change":  "restart | leadership | ",
		"slot lost over 23505":                "backOff | slot-lost | " + constraint,
		"slot lost over 55006":                "backOff | slot-busy | " + slotBusy,
		"slot lost over 55P03":                "backOff | slot-lost | " + lock,
		"slot lost over 53100":                "backOff | slot-lost | " + diskFull,
		"slot lost over source silent":        "backOff | slot-lost | " + slotLost,
		"slot lost over overlap":              "backOff | overlap | " + slotLost,
		"slot moved over 23505":               "restart | restart | " + constraint,
		"slot moved over slot lost":           "restart | restart | " + slotLost,
		"slot moved over permanent":           "stop",
		"watch over 55P03":                    "backOff | watch | " + lock,
		"watch over 55006":                    "backOff | watch | " + slotBusy,
		"watch over slot busy":                "backOff | watch | ",
		"key lost over 23505":                 "backOff | schema | " + constraint,
		"key lost over 55006":                 "backOff | slot-busy | " + slotBusy,
		"enum check over 23505":               "backOff | constraint | " + constraint,
		"slot busy over 55P03":                "backOff | slot-busy | " + lock,
		"slot busy over slot lost":            "backOff | slot-busy | " + slotLost,
		"slot missing over 23505":             "backOff | constraint | " + constraint,
		"rewritten over 55006":                "backOff | slot-busy | " + slotBusy,
		"rewritten over 55P03":                "backOff | schema | " + lock,
		"source silent over 53100":            "backOff | resources | " + diskFull,
		"source silent over connect":          "backOff | connection | " + silent,
		"permanent over schema change":        "stop",
		"permanent over slot lost":            "stop",
		"membership changed over overlap":     "restart | overlap | ",
		"connect and 28P01":                   "stop",
		"joined refusal and EOF":              "backOff | connection | ",
		"joined 23505 and 55006":              "backOff | constraint | " + constraint,
		"two server errors, lock first":       "backOff | lock | " + lock,
	}
}

// RetryReasons(), whose metric series exist from the start, are the labels of every reason.
func TestRetryReasonsAreTheReasons(t *testing.T) {
	var labels []string
	for r := disposition.ReasonOverlap; r <= disposition.ReasonOther; r++ {
		labels = append(labels, r.String())
	}
	if got := slices.Sorted(slices.Values(RetryReasons())); !slices.Equal(got, slices.Sorted(slices.Values(labels))) {
		t.Errorf("RetryReasons() %v, reasons %v", RetryReasons(), labels)
	}
}
