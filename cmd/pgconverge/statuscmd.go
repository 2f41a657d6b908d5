package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/spf13/cobra"
)

// statusConfig configures `pgconverge status`: the report's inputs, and how to print it.
type statusConfig struct {
	operator.StatusConfig
	Format string
}

// Validate reports every problem of the configuration at once.
func (c *statusConfig) Validate() error {
	return errors.Join(c.StatusConfig.Validate(), validateFormat(c.Format))
}

func newStatusCmd(stdout io.Writer) *cobra.Command {
	cfg := statusConfig{}
	cmd := &cobra.Command{
		Use:   "status --source URL --target URL [--slot pgconverge] [--format table|json]",
		Short: "Show a deployment at a glance: tables, slots and who holds them, lag, running backfills, the last verify",
		Long: `status reports, for an operator, per table: its coverage status (as pgconverge coverage computes it),
whether a stream follows it now, its lag in bytes and in seconds (the write_lag of the walsender that
holds its slot, from pg_stat_replication) and its watermark's age; per slot: its health (as coverage
reports it) and the session holding it (pid, application, client address, when it connected, its
walsender state and write/flush/replay lag) and, on PostgreSQL 17 and later, whether a promoted
standby could continue it (failover slots; --standby URL checks a standby's copy on the standby); the backfill runs recorded as running with their
trigger, start and chunks done of planned and rows so far per table, and whether their process is
alive; and the last verify run with the discrepancies open now.

Exit status: 0 when the report was made, whatever it shows (use coverage --fail-on-gap or verify for
checks), 1 on an error. URLs default to $PGCONVERGE_SOURCE and $PGCONVERGE_TARGET. The JSON format is
documented in docs/status.md and stays stable: fields are only ever added.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			rep, err := operator.Status(cmd.Context(), cfg.StatusConfig)
			if err != nil {
				return err
			}
			if cfg.Format == "json" {
				return writeJSON(stdout, rep)
			}
			printStatus(stdout, rep)
			return nil
		},
	}
	f := cmd.Flags()
	addURLFlags(f, &cfg.Source, &cfg.Target)
	f.StringVar(&cfg.Slot, "slot", "pgconverge", "slot to describe when no stream follows any table yet (streamed tables name their own)")
	addStandbyFlag(f, &cfg.Standbys)
	f.StringVar(&cfg.Format, "format", "table", "output format: table or json")
	return cmd
}

// printStatus writes the report for a terminal: a headline, the slots, one line per table, the
// running backfills and the last verify run.
func printStatus(w io.Writer, rep operator.StatusReport) {
	headline := "every streamed table is covered up to its watermark"
	if !rep.Covered {
		headline = "not covered (pgconverge coverage shows the gaps)"
	}
	fmt.Fprintf(w, "source at %s, %s; made %s\n\n", rep.SourceLSN, headline, rep.MadeAt.Format(time.RFC3339))
	for _, s := range rep.Slots {
		printSlotStatus(w, s)
	}
	printWaits(w, rep.Waiting)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSTATUS\tFOLLOWED\tLAG\tLAG TIME\tWATERMARK AGE")
	var notes []string
	for _, t := range rep.Tables {
		followed := "no"
		if t.Following {
			followed = "yes"
		}
		age := "-"
		if t.Slot != "" {
			age = seconds(t.WatermarkAgeSeconds)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Table, t.Status, followed, coverage.HumanBytes(t.LagBytes), secondsOr(t.LagSeconds), age)
		if t.Note != "" && (t.Status != coverage.Covered || !t.Following) {
			notes = append(notes, fmt.Sprintf("  %s: %s", t.Table, t.Note))
		}
	}
	tw.Flush()
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nnotes:")
		fmt.Fprintln(w, strings.Join(notes, "\n"))
	}
	printBackfills(w, rep.Backfills)
	printLastVerify(w, rep.LastVerify)
	printSlotCreations(w, rep.SlotCreations)
}

// printSlotCreations writes the slot creations that wait, each with the backends it waits for.
func printSlotCreations(w io.Writer, cs []operator.SlotCreation) {
	for _, c := range cs {
		fmt.Fprintf(w, "\nslot creation waits %.0fs (walsender pid %d, %s) for transactions open on the source:\n", c.WaitingSeconds, c.WalsenderPID, c.Command)
		for _, b := range c.Blockers {
			start := "-"
			if b.XactStart != nil {
				start = b.XactStart.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "  pid %d, application %q, user %s, %s since %s: %s\n", b.PID, b.Application, b.User, b.State, start, b.Query)
		}
	}
}

// printSlotStatus writes one slot: who holds it and its lag, then its hold on WAL and warning.
func printSlotStatus(w io.Writer, s operator.SlotStatus) {
	switch {
	case !s.Exists:
		fmt.Fprintf(w, "slot %s: missing\n", s.Name)
	case s.ActivePID == nil:
		fmt.Fprintf(w, "slot %s: no session holds it (the daemon is stopped, loading or reconnecting)\n", s.Name)
	default:
		who := []string{}
		for _, p := range []*string{s.ApplicationName, s.ClientAddr} {
			if p != nil && *p != "" {
				who = append(who, *p)
			}
		}
		if s.ClientAddr == nil && s.BackendStart != nil {
			who = append(who, "local socket")
		}
		line := fmt.Sprintf("slot %s: held by pid %d", s.Name, *s.ActivePID)
		if len(who) > 0 {
			line += " (" + strings.Join(who, ", ") + ")"
		}
		if s.ConnectedSeconds != nil {
			line += ", connected for " + seconds(*s.ConnectedSeconds)
		}
		if s.WalsenderState != nil {
			line += ", walsender " + *s.WalsenderState
		}
		line += fmt.Sprintf(", lag write %s, flush %s, replay %s", secondsOr(s.WriteLagSeconds), secondsOr(s.FlushLagSeconds), secondsOr(s.ReplayLagSeconds))
		fmt.Fprintln(w, line)
		if s.HolderNote != "" {
			fmt.Fprintf(w, "  note: %s\n", s.HolderNote)
		}
	}
	if st := s.Streaming; st != nil {
		fmt.Fprintf(w, "  decoding: %d transaction(s) spilled to the source's disk (%s), %d streamed before their commit (%s); open now: %d, staged on the target: %d messages (%s), %d row table(s) (%s)\n",
			st.SpillTransactions, coverage.HumanBytes(uint64(st.SpillBytes)), st.StreamTransactions, coverage.HumanBytes(uint64(st.StreamBytes)),
			st.OpenTransactions, st.StagedMessages, coverage.HumanBytes(uint64(st.StagedBytes)), st.StagedRowTables, coverage.HumanBytes(uint64(st.StagedRowBytes)))
	}
	if l := s.Leader; l != nil {
		state := "led by"
		if !l.Alive {
			state = "last led by"
		}
		fmt.Fprintf(w, "  %s %s (epoch %d, since %s), %d standby(s) waiting\n", state, l.Holder, l.Epoch, l.Since, l.Standbys)
	}
	for _, p := range s.Controls.Paused {
		fmt.Fprintf(w, "  PAUSED: %s since %s (by %s); pgconverge resume --slot %s --what %s\n", p.What, p.Since.UTC().Format(time.RFC3339), p.By, s.Name, p.What)
	}
	if l := s.Controls.Limits; l != nil && (l.RowsPerSecond > 0 || l.BytesPerSecond > 0) {
		fmt.Fprintf(w, "  rate limits of backfills and verifies: %s, %s (set by %s at %s)\n", rateText(l.RowsPerSecond, "rows"), rateText(l.BytesPerSecond, "bytes"),
			l.SetBy, l.SetAt.UTC().Format(time.RFC3339))
	}
	if s.Exists && !s.Invalidated() {
		safe := "unlimited"
		if s.SafeWALSizeBytes != nil {
			safe = coverage.HumanBytes(uint64(max(*s.SafeWALSizeBytes, 0)))
		}
		fmt.Fprintf(w, "  wal_status %s, safe_wal_size %s, holds %s of WAL\n", s.WALStatus, safe, coverage.HumanBytes(s.RestartLagBytes))
	}
	if s.Warning != "" {
		fmt.Fprintf(w, "WARNING: %s\n", s.Warning)
	}
	printFailover(w, s.Failover)
}

// printBackfills writes the running backfill runs, one line per table.
func printBackfills(w io.Writer, runs []coverage.RunningBackfill) {
	if len(runs) == 0 {
		fmt.Fprintln(w, "\nno backfill running")
		return
	}
	fmt.Fprintln(w, "\nbackfills running:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tTRIGGER\tSTARTED\tTABLE\tSTATUS\tCHUNKS DONE\tROWS")
	var dead []string
	for _, r := range runs {
		started := fmt.Sprintf("%s (%s ago)", r.StartedAt.Local().Format(time.DateTime), seconds(r.RunningSeconds))
		if !r.Alive {
			dead = append(dead, fmt.Sprint(r.RunID))
		}
		if len(r.Tables) == 0 {
			fmt.Fprintf(tw, "%d\t%s\t%s\t-\ttaking its snapshot\t-\t-\n", r.RunID, r.Trigger, started)
		}
		for _, t := range r.Tables {
			chunks := fmt.Sprintf("%d/%d", t.ChunksDone, t.ChunksPlanned)
			if !t.PlanningComplete {
				chunks += " (planning)"
			}
			if t.ChunksApplying > 0 {
				chunks += fmt.Sprintf(", %d applying", t.ChunksApplying)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\n", r.RunID, r.Trigger, started, t.Table, t.Status, chunks, t.Rows)
		}
	}
	tw.Flush()
	if len(dead) > 0 {
		fmt.Fprintf(w, "run %s: recorded as running, but its process is gone (it was killed, lost its target connection, or froze and had its sessions ended after the lease): the next backfill run closes it as failed and resumes its tables\n", strings.Join(dead, ", "))
	}
	for _, r := range runs {
		if r.Alive && r.Joinable {
			fmt.Fprintf(w, "run %d: more workers, from any host: pgconverge backfill --join --run %d\n", r.RunID, r.RunID)
		}
	}
}

// printLastVerify writes the last verify run, or that there was none.
func printLastVerify(w io.Writer, v *coverage.LastVerify) {
	if v == nil {
		fmt.Fprintln(w, "\nlast verify: none recorded (pgconverge verify, or run --verify-schedule)")
		return
	}
	fmt.Fprintf(w, "\nlast verify: run %d (%s) %s, started %s (%s ago): %s, %d found, %d repaired, %d open at its end; %s open now\n",
		v.RunID, v.Trigger, v.Status, v.StartedAt.Local().Format(time.DateTime), seconds(v.AgeSeconds), count(int64(v.Tables), "table"),
		v.Found, v.Repaired, v.Open, count(v.OpenNow, "discrepancy"))
	if v.Error != "" {
		fmt.Fprintf(w, "  error: %s\n", v.Error)
	}
}

// seconds prints a number of seconds as a duration: "850ms", "2.1s", "3m4s".
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// secondsOr prints seconds, or "-" for nil (PostgreSQL shows no measurement).
func secondsOr(s *float64) string {
	if s == nil {
		return "-"
	}
	return seconds(*s)
}

// count prints n things: "1 table", "2 tables", "0 discrepancies".
func count(n int64, thing string) string {
	switch {
	case n == 1:
		return "1 " + thing
	case strings.HasSuffix(thing, "y"):
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(thing, "y"))
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
