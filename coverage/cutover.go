package coverage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// ReasonCutover ends the stream segment and retires the tables of a cutover.
const ReasonCutover = "cutover"

// Cutover is the record of a slot's cutover (pgconverge.cutovers).
type Cutover struct {
	Slot string
	// CutLSN is the source position the stream had applied when the cutover stopped it;
	// VerifiedLSN the exact snapshot verify compared at (0 when verify was skipped).
	CutLSN, VerifiedLSN pglogrepl.LSN
	Tables              []changebatch.TableName
	CutAt               time.Time
	// SlotDropped and Finalized are when those last steps were done; nil when not (yet).
	SlotDropped, Finalized *time.Time
}

// RecordCutover records, in one transaction, that slot's replication ended at cut: the slot's
// stream segment and table spans end there (EndSegment, ReasonCutover), and tables are retired
// with ReasonCutover. It is done once: a cutover recorded already is left as it was.
func RecordCutover(ctx context.Context, conn *pgx.Conn, slot string, cut, verified pglogrepl.LSN, tables []changebatch.TableName) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		names := make([]string, len(tables))
		for i, t := range tables {
			names[i] = t.String()
		}
		var v *string
		if verified != 0 {
			s := verified.String()
			v = &s
		}
		tag, err := tx.Exec(ctx, `insert into pgconverge.cutovers (slot, cut_lsn, verified_lsn, tables) values ($1, $2::pg_lsn, $3::pg_lsn, $4)
on conflict (slot) do nothing`, slot, cut.String(), v, names)
		if err != nil {
			return fmt.Errorf("record the cutover of slot %q: %w", slot, err)
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		if _, err := EndSegment(ctx, tx, slot, cut, ReasonCutover); err != nil {
			return err
		}
		reasons := map[changebatch.TableName]string{}
		for _, t := range tables {
			reasons[t] = ReasonCutover
		}
		return RetireLeft(ctx, tx.Conn(), reasons)
	})
}

// LatestCutover returns the newest cutover recorded in the target, of any slot, and false when
// none is (also on a ledger older than cutovers).
func LatestCutover(ctx context.Context, conn *pgx.Conn) (Cutover, bool, error) {
	if ok, err := hasCutovers(ctx, conn); err != nil || !ok {
		return Cutover{}, false, err
	}
	var slot string
	err := conn.QueryRow(ctx, `select slot from pgconverge.cutovers order by cut_at desc limit 1`).Scan(&slot)
	if errors.Is(err, pgx.ErrNoRows) {
		return Cutover{}, false, nil
	}
	if err != nil {
		return Cutover{}, false, fmt.Errorf("read the cutovers of the target: %w", err)
	}
	return ReadCutover(ctx, conn, slot)
}

// hasCutovers reports whether the ledger has pgconverge.cutovers.
func hasCutovers(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var known bool
	if err := conn.QueryRow(ctx, `select to_regclass('pgconverge.cutovers') is not null`).Scan(&known); err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InsufficientPrivilege {
			return false, fmt.Errorf("look up the cutover records (the target role needs USAGE on schema pgconverge; after a cutover, was it given to another role?): %w", err)
		}
		return false, fmt.Errorf("look up the cutover records: %w", err)
	}
	return known, nil
}

// ReadCutover returns slot's cutover record, and false when the slot was not cut over (also on
// a ledger older than cutovers).
func ReadCutover(ctx context.Context, conn *pgx.Conn, slot string) (Cutover, bool, error) {
	c := Cutover{Slot: slot}
	if known, err := hasCutovers(ctx, conn); err != nil || !known {
		return c, false, err
	}
	var cut string
	var verified *string
	var names []string
	err := conn.QueryRow(ctx, `select cut_lsn::text, verified_lsn::text, tables, cut_at, slot_dropped_at, finalized_at
from pgconverge.cutovers where slot = $1`, slot).Scan(&cut, &verified, &names, &c.CutAt, &c.SlotDropped, &c.Finalized)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("read the cutover of slot %q: %w", slot, err)
	}
	if c.CutLSN, err = pglogrepl.ParseLSN(cut); err != nil {
		return c, false, err
	}
	if verified != nil {
		if c.VerifiedLSN, err = pglogrepl.ParseLSN(*verified); err != nil {
			return c, false, err
		}
	}
	for _, n := range names {
		t, err := changebatch.ParseTableName(n)
		if err != nil {
			return c, false, err
		}
		c.Tables = append(c.Tables, t)
	}
	return c, true, nil
}

// MarkCutoverStep records that the cutover of slot did step "slot_dropped" or "finalized" now.
func MarkCutoverStep(ctx context.Context, conn *pgx.Conn, slot, step string) error {
	col := map[string]string{"slot_dropped": "slot_dropped_at", "finalized": "finalized_at"}[step]
	if col == "" {
		return fmt.Errorf("unknown cutover step %q", step)
	}
	if _, err := conn.Exec(ctx, `update pgconverge.cutovers set `+col+` = coalesce(`+col+`, now()) where slot = $1`, slot); err != nil {
		return fmt.Errorf("record the cutover of slot %q: %w", slot, err)
	}
	return nil
}

// RefuseIfCutOver returns an error naming what (a command) when a cutover is recorded in the
// target (LatestCutover): its tables are the application's, which no pgconverge command
// writes into any more.
func RefuseIfCutOver(ctx context.Context, tgt *pgx.Conn, what string) error {
	c, cut, err := LatestCutover(ctx, tgt)
	if err != nil || !cut {
		return err
	}
	return fmt.Errorf("%s refused: slot %q was cut over into this target at %s (pgconverge.cutovers), so its tables are the application's and pgconverge writes into none of them; start over (docs/cutover.md, \"Starting over\") to replicate into it again",
		what, c.Slot, c.CutLSN)
}
