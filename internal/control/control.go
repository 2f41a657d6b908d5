// Package control keeps an operator's controls of a slot's daemon in the target's ledger: what of
// it is paused (`pgconverge pause`, `resume`: pgconverge.pauses) and the rate limits of its
// backfills and verifies (run's flags, `backfill --set`, a settings file reloaded on SIGHUP:
// pgconverge.rate_limits). The daemon reads them every second (engine's control follower), so
// they outlive its restarts and reach every daemon of the slot, standbys included.
package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/internal/pacing"
)

// The parts of a daemon a pause stops.
const (
	// Stream: the daemon reads the slot no further (the slot is kept, and holds WAL meanwhile).
	Stream = "stream"
	// Backfill: its backfills wait before their next chunk and batch.
	Backfill = "backfill"
	// Verify: its verifies wait before their next table and query.
	Verify = "verify"
)

// Parts are every part a pause may stop, in order: what "all" means.
var Parts = []string{Stream, Backfill, Verify}

// ParseParts returns the parts --what names: "all", or a comma-separated list of stream,
// backfill and verify. The error names the flag and the choices.
func ParseParts(what string) ([]string, error) {
	if what == "all" {
		return Parts, nil
	}
	var out []string
	for _, p := range strings.Split(what, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(Parts, p) {
			return nil, fmt.Errorf("--what %q: want all, or stream, backfill and verify separated by commas", what)
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// Querier is what the functions need of a target connection or transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Paused is one part of a slot's daemon that is paused: since when, and by whom (the target role
// and the command that paused it).
type Paused struct {
	What  string    `json:"what"`
	Since time.Time `json:"since"`
	By    string    `json:"by"`
}

// Pause records parts of slot's daemon as paused by by; it returns the parts that were not paused
// before (a part paused already keeps its time).
func Pause(ctx context.Context, q Querier, slot string, parts []string, by string) ([]string, error) {
	rows, err := q.Query(ctx, `insert into pgconverge.pauses (slot, what, paused_by)
		select $1, w, $3 from unnest($2::text[]) w
		on conflict (slot, what) do nothing returning what`, slot, parts, by)
	if err != nil {
		return nil, fmt.Errorf("record the pause of slot %q: %w", slot, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Resume deletes the pauses of parts of slot's daemon; it returns the parts that were paused.
func Resume(ctx context.Context, q Querier, slot string, parts []string) ([]string, error) {
	rows, err := q.Query(ctx, `delete from pgconverge.pauses where slot = $1 and what = any($2::text[]) returning what`, slot, parts)
	if err != nil {
		return nil, fmt.Errorf("delete the pause of slot %q: %w", slot, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Limits are the rate limits recorded for a slot's daemon, with when and by what they were set.
type Limits struct {
	pacing.Limits
	SetAt time.Time `json:"set_at"`
	SetBy string    `json:"set_by"`
}

// SetLimits records l as the rate limits of slot's daemon, set by by (for status).
func SetLimits(ctx context.Context, q Querier, slot string, l pacing.Limits, by string) error {
	if l.RowsPerSecond < 0 || l.BytesPerSecond < 0 {
		return errors.New("a rate limit is negative: use 0 for no limit")
	}
	_, err := q.Exec(ctx, `insert into pgconverge.rate_limits (slot, max_rows_per_second, max_bytes_per_second, set_by)
		values ($1, $2, $3, $4)
		on conflict (slot) do update set max_rows_per_second = excluded.max_rows_per_second,
			max_bytes_per_second = excluded.max_bytes_per_second, set_at = now(), set_by = excluded.set_by`,
		slot, l.RowsPerSecond, l.BytesPerSecond, by)
	if err != nil {
		return fmt.Errorf("record the rate limits of slot %q: %w", slot, err)
	}
	return nil
}

// State is what the ledger holds of slot's daemon's controls: its paused parts (in Parts order)
// and its rate limits (nil when none were ever recorded).
type State struct {
	Paused []Paused `json:"paused"`
	Limits *Limits  `json:"rate_limits,omitempty"`
}

// IsPaused reports whether part is paused.
func (s State) IsPaused(part string) bool {
	return slices.ContainsFunc(s.Paused, func(p Paused) bool { return p.What == part })
}

// Read returns the controls of slot's daemon.
func Read(ctx context.Context, q Querier, slot string) (State, error) {
	var st State
	rows, err := q.Query(ctx, `select what, paused_at, paused_by from pgconverge.pauses where slot = $1
		order by array_position(array['stream', 'backfill', 'verify'], what)`, slot)
	if err != nil {
		return st, fmt.Errorf("read the pauses of slot %q: %w", slot, err)
	}
	if st.Paused, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Paused]); err != nil {
		return st, fmt.Errorf("read the pauses of slot %q: %w", slot, err)
	}
	rows, err = q.Query(ctx, `select max_rows_per_second, max_bytes_per_second, set_at, set_by from pgconverge.rate_limits where slot = $1`, slot)
	if err != nil {
		return st, fmt.Errorf("read the rate limits of slot %q: %w", slot, err)
	}
	limits, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Limits, error) {
		var l Limits
		err := r.Scan(&l.RowsPerSecond, &l.BytesPerSecond, &l.SetAt, &l.SetBy)
		return l, err
	})
	if err != nil {
		return st, fmt.Errorf("read the rate limits of slot %q: %w", slot, err)
	}
	if len(limits) == 1 {
		st.Limits = &limits[0]
	}
	return st, nil
}
