package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/spf13/cobra"
)

func newCutoverCmd(stdout, stderr io.Writer) *cobra.Command {
	cfg := operator.CutoverConfig{Run: engine.Config{OnGap: engine.OnGapRepair}}
	var logFormat, logLevel, format string
	cmd := &cobra.Command{
		Use:   "cutover --source URL --target URL [--slot pgconverge] [--drop-slot=true] [--drop-publication] [--finalize] [--pause-writes ROLE]",
		Short: "Finish replicating: catch up, verify, sync sequences, stop following, retire the tables",
		Long: `cutover ends replication into the target, for moving an application to it. Stop the application's
writes to the source and the daemon (pgconverge run) first. cutover then:

 1. streams from the slot, as run does, until the target holds every change up to the source's
    position when it started, and checks that coverage has no gap;
 2. verifies every table at an exact snapshot, repairing what it finds (--skip-verify leaves it
    out), and syncs the target's sequences past the source's;
 3. stops streaming and records the cutover in the target: the tables are retired, so coverage
    reports no gap for them, and a run that selects them again loads them anew;
 4. drops the slot (--drop-slot, the default: a slot left behind keeps the source's WAL forever),
    with --drop-publication the publication, and with --finalize makes the target tables plain
    (tombstones deleted, _cdc_ columns and live views dropped) and gives them the source's schema
    objects: NOT NULL, defaults, identities with their sequences' positions, check, unique,
    exclusion and foreign-key constraints (checks and foreign keys added NOT VALID, then
    validated), indexes, triggers (firing only from then on) and comments, then analyzes them and
    compares each table's schema with the source's (as verify --schema does).

With --pause-writes ROLE it is a switchover that needs no hand in between: before step 1 it pauses
the application's writes on the source by revoking ROLE's INSERT, UPDATE, DELETE and TRUNCATE on
the publication's tables (recorded in the target first; a role that could still write, as a
superuser can, is refused), waits for ROLE's open write transactions to end, rehearses the
finalize before step 3 (in a transaction it rolls back), finalizes (--finalize is implied) and
prints how long the writes were paused. The writes stay revoked after it: the application writes
to the target now. On a failure before step 3 it gives them back and cuts over nothing;
--resume-writes only gives back what an interrupted switchover left revoked.

Run again after a crash or an error, it resumes: before step 3 it starts over, after it, it does
what is left of step 4. Exit status: 0 when done, 1 on an error (nothing is cut over before step
3 succeeds). URLs default to $PGCONVERGE_SOURCE and $PGCONVERGE_TARGET.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			cfg.Run.Logger = logger
			if err := errors.Join(cfg.Run.Validate(), validateFormat(format)); err != nil {
				return err
			}
			if cfg.ResumeWrites && cfg.PauseWrites != "" {
				return errors.New("--resume-writes gives back a pause and does nothing else: leave out --pause-writes")
			}
			rep, err := operator.Cutover(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if cfg.ResumeWrites {
				if rep.WritesGivenBack {
					fmt.Fprintf(stdout, "gave back the writes of role %s that an interrupted switchover of slot %s had paused\n", rep.PausedRole, rep.Slot)
				} else {
					fmt.Fprintf(stdout, "no switchover of slot %s left writes paused: nothing to give back\n", rep.Slot)
				}
				return nil
			}
			if format == "json" {
				return writeJSON(stdout, rep)
			}
			printCutover(stdout, rep)
			return nil
		},
	}
	f := cmd.Flags()
	addURLFlags(f, &cfg.Run.Source, &cfg.Run.Target)
	addPrimaryFlag(f, &cfg.Run.Primary)
	f.StringArrayVar(&cfg.Run.Tables, "tables", nil, "the daemon's --tables, if it had them (the catch-up streams them as run does)")
	f.StringVar(&cfg.Run.Slot, "slot", "pgconverge", "the daemon's logical replication slot")
	f.StringVar(&cfg.Run.Publication, "publication", "pgconverge", "the daemon's publication")
	addFailoverSlotFlag(f, &cfg.Run.FailoverSlot)
	addStreamInProgressFlag(f, &cfg.Run.StreamInProgress)
	addBackfillFlags(f, &cfg.Run.BackfillWorkers, &cfg.Run.ChunkRows, &cfg.Run.SnapshotWarn)
	f.BoolVar(&cfg.SkipVerify, "skip-verify", false, "leave out the verify step")
	f.BoolVar(&cfg.DropSlot, "drop-slot", true, "drop the slot once the tables are retired (false keeps it, and the source's WAL with it)")
	f.BoolVar(&cfg.DropPublication, "drop-publication", false, "drop the publication too")
	f.BoolVar(&cfg.Finalize, "finalize", false, "make the target tables plain tables (delete tombstones, drop the _cdc_ columns and the live views) with the source's constraints, defaults, indexes, triggers and comments")
	f.BoolVar(&cfg.CarryOwnership, "carry-ownership", false, "with --finalize, give each table the source table's owner and grants (the roles must exist on the target, and the target role must be a member of the owner)")
	f.StringVar(&cfg.PauseWrites, "pause-writes", "", "ROLE: pause the writes of the application's role on the source for the switchover (revoked; given back on a failure; implies --finalize)")
	f.BoolVar(&cfg.ResumeWrites, "resume-writes", false, "only give back the writes an interrupted --pause-writes left revoked, and do nothing else")
	f.DurationVar(&cfg.Timeout, "timeout", 0, "how long to wait for the target to catch up (default 10m)")
	f.StringVar(&format, "format", "table", "output format: table or json")
	addLogFlags(f, &logFormat, &logLevel)
	return cmd
}

// printCutover writes the cutover's report for a terminal.
func printCutover(w io.Writer, rep operator.CutoverReport) {
	if rep.Resumed {
		fmt.Fprintln(w, "cut over by an earlier run; this one did what was left")
	}
	fmt.Fprintf(w, "slot %s cut over at %s: the target holds every change of the source up to it\n", rep.Slot, rep.CutLSN)
	if rep.VerifiedLSN != "" {
		fmt.Fprintf(w, "verified equal at the exact snapshot %s\n", rep.VerifiedLSN)
	}
	fmt.Fprintf(w, "retired: %s\n", strings.Join(rep.Tables, ", "))
	if len(rep.Sequences) > 0 {
		printSequences(w, rep.Sequences)
	}
	fmt.Fprintf(w, "slot dropped: %v; publication dropped: %v\n", rep.SlotDropped, rep.PublicationDropped)
	if len(rep.Finalized) > 0 {
		fmt.Fprintf(w, "made plain: %s\n", strings.Join(rep.Finalized, ", "))
	}
	for _, c := range rep.Carried {
		fmt.Fprintf(w, "carried over from the source: %s\n", c)
	}
	for _, c := range rep.TargetOnly {
		fmt.Fprintf(w, "left as it is, only on the target: %s\n", c)
	}
	if rep.PausedRole != "" {
		fmt.Fprintf(w, "writes of role %s paused for %.1fs; they stay revoked on the source: point the application at the target\n", rep.PausedRole, rep.WritePauseSeconds)
	}
}
