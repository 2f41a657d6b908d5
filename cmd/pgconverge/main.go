// Command pgconverge keeps tables in a target PostgreSQL converged with a source PostgreSQL:
// `pgconverge run` streams changes with logical replication after an initial load from an exact
// snapshot. See docs/cli (generated from these commands by scripts/gen-cli-docs.sh) and docs/ for
// the CLI contract.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/pgconverge/pgconverge/internal/engine"
	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgconverge:", err)
		os.Exit(exitCode(err))
	}
}

// exitCode returns the process exit status for run's error: 0 for none, an exitError's Code
// (coverage's gap, verify's open discrepancies), else 1.
func exitCode(err error) int {
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.Code
	}
	return 1
}

// run executes the command line args; it is main without the process: tests call it directly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// newRootCmd returns the pgconverge command with every subcommand, writing reports to stdout and
// logs, progress and help to stderr. It is the one command tree: run executes it, and the
// gendocs build (scripts/gen-cli-docs.sh) renders it into docs/cli.
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "pgconverge",
		Short:         "Keep tables in a target PostgreSQL converged with a source PostgreSQL",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	if info, ok := debug.ReadBuildInfo(); ok {
		root.Version = info.Main.Version
		for _, kv := range info.Settings {
			if kv.Key == "vcs.revision" {
				root.Version += " (" + kv.Value + ")"
			}
		}
	}
	var configPath string
	root.PersistentFlags().StringVar(&configPath, "config", os.Getenv("PGCONVERGE_CONFIG"), "settings file (YAML): keys are flag names, top level for every command that has the flag, or under a command's name; the command line wins ($PGCONVERGE_CONFIG)")
	budget := byteSize(engine.DefaultMemoryBudget)
	root.PersistentFlags().Var(&budget, "memory-budget", "memory the process may use (256MiB, 1GiB): the Go runtime's soft limit, and what sizes the stream's groups (a sixteenth each, two held at most); a source transaction larger than a group is applied in parts, committed with the progress held before it")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if configPath != "" {
			if err := applyConfig(root, cmd, configPath); err != nil {
				return err
			}
		}
		debug.SetMemoryLimit(int64(budget))
		return nil
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newRunCmd(stderr, &budget), newBackfillCmd(stdout, stderr), newCoverageCmd(stdout), newSequencesCmd(stdout, stderr), newVerifyCmd(stdout, stderr), newRetireCmd(stdout), newStatusCmd(stdout), newPauseCmd(stdout, false), newPauseCmd(stdout, true),
		newCutoverCmd(stdout, stderr))
	root.AddCommand(devCommands(root)...)
	return root
}
