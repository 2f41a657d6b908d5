package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/pgconverge/pgconverge/internal/control"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/spf13/cobra"
)

// newPauseCmd returns `pgconverge pause` (resume false) or `pgconverge resume` (resume true).
func newPauseCmd(stdout io.Writer, resume bool) *cobra.Command {
	cfg := operator.PauseConfig{}
	var what string
	name, short, long := "pause", "Pause a daemon's stream, backfills or verifies, across its restarts, keeping its slot",
		`pause records in the target's ledger that parts of the daemon of --slot are paused; the daemon
follows within a second, and a daemon started later stays paused. --what names the parts: stream (the
slot is read no further: it is kept, and holds WAL on the source meanwhile), backfill (backfills wait
before their next chunk and batch, holding their snapshot), verify (verifies wait before their next
table and query), or all. pgconverge status shows what is paused, since when, and the WAL the slot
holds. A paused stream whose slot reaches 80% of the daemon's WAL budget (run --wal-budget) resumes
by itself, and the daemon logs it: a pause never costs the slot.

Prints one line per part. Exit status 0. The URL defaults to $PGCONVERGE_TARGET.`
	if resume {
		name, short, long = "resume", "Resume what pgconverge pause paused",
			`resume deletes the pauses of --what (stream, backfill, verify, all) of the daemon of --slot from the
target's ledger; the daemon goes on within a second. Prints one line per part. Exit status 0.
The URL defaults to $PGCONVERGE_TARGET.`
	}
	cmd := &cobra.Command{
		Use:   name + " --target URL [--slot pgconverge] [--what all|stream,backfill,verify]",
		Short: short,
		Long:  long,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			parts, err := control.ParseParts(what)
			cfg.Parts = parts
			if err := errors.Join(err, cfg.Validate()); err != nil {
				return err
			}
			change := operator.Pause
			if resume {
				change = operator.Resume
			}
			res, err := change(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			for _, part := range cfg.Parts {
				changed := strings.Contains(","+strings.Join(res.Changed, ",")+",", ","+part+",")
				switch {
				case resume && changed:
					fmt.Fprintf(stdout, "resumed %s of slot %s\n", part, cfg.Slot)
				case resume:
					fmt.Fprintf(stdout, "%s of slot %s was not paused\n", part, cfg.Slot)
				case changed:
					fmt.Fprintf(stdout, "paused %s of slot %s\n", part, cfg.Slot)
				default:
					fmt.Fprintf(stdout, "%s of slot %s was paused already\n", part, cfg.Slot)
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Target, "target", os.Getenv("PGCONVERGE_TARGET"), "target PostgreSQL URL ($PGCONVERGE_TARGET)")
	f.StringVar(&cfg.Slot, "slot", "pgconverge", "the slot of the daemon")
	f.StringVar(&what, "what", "all", "what to "+name+": all, or stream, backfill and verify separated by commas")
	return cmd
}

// setDaemonLimits is `backfill --set`: it changes the rate limits of slot's daemon to the
// --max-rows-per-second and --max-bytes-per-second given (one left out keeps its value) and prints
// them.
func setDaemonLimits(cmd *cobra.Command, stdout io.Writer, target, slot string, limits rateLimitFlags) error {
	rows, bytes := cmd.Flags().Lookup("max-rows-per-second"), cmd.Flags().Lookup("max-bytes-per-second")
	if !rows.Changed && !bytes.Changed {
		return errors.New("--set changes the daemon's rate limits: give --max-rows-per-second or --max-bytes-per-second (0: no limit)")
	}
	if target == "" {
		return errors.New("no target: pass --target URL or set $PGCONVERGE_TARGET")
	}
	l, err := operator.SetRateLimits(cmd.Context(), target, slot, func(cur *pacing.Limits) {
		if rows.Changed {
			cur.RowsPerSecond = limits.rows
		}
		if bytes.Changed {
			cur.BytesPerSecond = float64(limits.bytes)
		}
	}, "backfill --set")
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rate limits of slot %s: %s, %s (each for its backfills and its verifies; the daemon follows within a second)\n",
		slot, rateText(l.RowsPerSecond, "rows"), rateText(l.BytesPerSecond, "bytes"))
	return nil
}

// rateText prints a limit of unit per second, "no limit" for 0.
func rateText(v float64, unit string) string {
	switch {
	case v == 0:
		return "no " + unit + " limit"
	case unit == "bytes":
		return humanize.IBytes(uint64(v)) + "/s"
	}
	return humanize.Commaf(v) + " " + unit + "/s"
}
