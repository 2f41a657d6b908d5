package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// byteCount is a flag value of bytes written with or without a unit, as "8MiB", "20MB" or
// "1048576" (go-humanize, as byteSize); 0 is allowed.
type byteCount int64

// String returns the count in IEC units.
func (b *byteCount) String() string { return humanize.IBytes(uint64(*b)) }

// Set parses s.
func (b *byteCount) Set(s string) error {
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return fmt.Errorf("%q is not a size (write it as 8MiB, 1GiB or bytes): %w", s, err)
	}
	*b = byteCount(n)
	return nil
}

// Type names the value in usage.
func (b *byteCount) Type() string { return "size" }

// rowRate is a flag value of rows per second: a number, 0 or more.
type rowRate float64

// String returns the rate.
func (r *rowRate) String() string { return strconv.FormatFloat(float64(*r), 'g', -1, 64) }

// Set parses s; a negative rate is refused.
func (r *rowRate) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a number of rows a second", s)
	case v < 0:
		return fmt.Errorf("%s is negative: use 0 for no limit", s)
	}
	*r = rowRate(v)
	return nil
}

// Type names the value in usage.
func (r *rowRate) Type() string { return "rows" }

// rateLimitFlags are --max-rows-per-second and --max-bytes-per-second.
type rateLimitFlags struct {
	rows  float64
	bytes byteCount
}

// limits returns the flags' limits.
func (r *rateLimitFlags) limits() pacing.Limits {
	return pacing.Limits{RowsPerSecond: r.rows, BytesPerSecond: float64(r.bytes)}
}

// addRateLimitFlags adds --max-rows-per-second and --max-bytes-per-second to f; what names the
// reads they limit in their help.
func addRateLimitFlags(f *pflag.FlagSet, r *rateLimitFlags, what string) {

	f.Var((*rowRate)(&r.rows), "max-rows-per-second", "read at most this many rows a second from the source in "+what+", all workers together (0: no limit); changed while running by a SIGHUP that reloads --config"+
		" (and for run by backfill --set)")
	f.Var(&r.bytes, "max-bytes-per-second", "read at most this many bytes a second from the source in "+what+", as 8MiB (0: no limit); changed as --max-rows-per-second")
}

// addChunkTimeCapFlag adds --chunk-time-cap, shared by run and backfill.
func addChunkTimeCapFlag(f *pflag.FlagSet, d *time.Duration) {
	f.DurationVar(d, "chunk-time-cap", 0, "how long one read of the source may take: a chunk read that takes longer has the table's further reads split, each a statement of half as many rows (continuing after the last key read); 0 reads each chunk in one statement")
}

// addPacingFlags adds run's flags of the WAL budget and the load-aware pacing to f.
func addPacingFlags(f *pflag.FlagSet, budget *byteCount, l *engine.LoadLimits) {
	f.Var(budget, "wal-budget", "WAL the slot may hold: from half of it backfills and verifies wait for the stream to catch up, from 80% the daemon warns and resumes a paused stream (0: max_slot_wal_keep_size, or 16GiB when that is unlimited; never above max_slot_wal_keep_size)")
	*l = engine.DefaultLoadLimits
	f.BoolVar(&l.Enabled, "pace", false, "make backfills and verifies wait while the source is under load: a standby replays more than --pace-standby-lag behind, the stream is more than --pace-stream-lag behind, or more than --pace-active-sessions sessions run statements (checked every 5 s)")
	f.Var((*byteCount)(&l.StandbyLagBytes), "pace-standby-lag", "with --pace: the replay lag of the source's physical standbys past which backfills and verifies wait (0: not checked)")
	f.Var((*byteCount)(&l.StreamLagBytes), "pace-stream-lag", "with --pace: the stream's lag behind the source past which backfills while streaming and verifies wait (0: not checked)")
	f.IntVar(&l.ActiveSessions, "pace-active-sessions", l.ActiveSessions, "with --pace: the source's active sessions (pg_stat_activity, pgconverge's left out) past which backfills and verifies wait (0: not checked)")
}

// reloadLimitsOnHangup re-reads the rate limits from cmd's settings file (--config) at each
// SIGHUP until ctx ends, and calls set with a change that sets the limits the file gives
// (max-rows-per-second, max-bytes-per-second, top level or under the command's name) and keeps
// the others as they are in force. A file it cannot read is logged at ERROR and changes nothing.
// Without --config it does nothing.
func reloadLimitsOnHangup(ctx context.Context, cmd *cobra.Command, log *slog.Logger, set func(context.Context, func(*pacing.Limits)) (pacing.Limits, error)) {
	path := ""
	if f := cmd.Flag("config"); f != nil {
		path = f.Value.String()
	}
	if path == "" {
		return
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			change, err := limitsFromFile(path, cmd.Name())
			var l pacing.Limits
			if err == nil {
				l, err = set(ctx, change)
			}
			if err != nil {
				log.Error("SIGHUP: rate limits not reloaded, the ones in force stay", "config", path, "err", err)
				continue
			}
			log.Info("SIGHUP: rate limits reloaded", "config", path, "max_rows_per_second", l.RowsPerSecond, "max_bytes_per_second", l.BytesPerSecond)
		}
	}()
}

// limitsFromFile reads the rate limits of command from the settings file at path and returns the
// change that sets those it gives (a command's section wins over the top level).
func limitsFromFile(path, command string) (func(*pacing.Limits), error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var r rateLimitFlags
	f := pflag.NewFlagSet(command, pflag.ContinueOnError)
	addRateLimitFlags(f, &r, "")
	scopes := []map[string]any{doc}
	if section, ok := doc[command].(map[string]any); ok {
		scopes = append(scopes, section)
	}
	for _, scope := range scopes {
		for _, name := range []string{"max-rows-per-second", "max-bytes-per-second"} {
			if v, ok := scope[name]; ok {
				if err := f.Set(name, fmt.Sprint(v)); err != nil {
					return nil, fmt.Errorf("%s: %s: %w", path, name, err)
				}
			}
		}
	}
	rows, bytes := f.Lookup("max-rows-per-second").Changed, f.Lookup("max-bytes-per-second").Changed
	return func(l *pacing.Limits) {
		if rows {
			l.RowsPerSecond = r.rows
		}
		if bytes {
			l.BytesPerSecond = float64(r.bytes)
		}
	}, nil
}

// setPacerLimits returns the set of reloadLimitsOnHangup for a process's own pacer p.
func setPacerLimits(p *pacing.Pacer) func(context.Context, func(*pacing.Limits)) (pacing.Limits, error) {
	return func(_ context.Context, change func(*pacing.Limits)) (pacing.Limits, error) {
		l := p.Limits()
		change(&l)
		p.SetLimits(l)
		return l, nil
	}
}
