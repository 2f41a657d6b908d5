package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgconverge/pgconverge/internal/engine"
	"github.com/spf13/cobra"
)

// writeConfig writes a settings file into the test's folder and returns its path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pgconverge.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A settings file gives flags by their names, at top level or under the command's name; the
// command line wins, lists fill repeatable flags, and a key no command has, or a section key its
// command lacks, is an error naming it.
func TestSettingsFile(t *testing.T) {
	t.Setenv("PGCONVERGE_SOURCE", "")
	t.Setenv("PGCONVERGE_TARGET", "")
	path := writeConfig(t, `
source: postgres://from-file/src
target: postgres://from-file/tgt
run:
  tables: [app.*, billing.invoices]
  tombstone-retention: 48h
  live-suffix: _now
verify:
  repair: true
`)
	var got *cobra.Command
	root := &cobra.Command{Use: "pgconverge"}
	var cfgPath string
	root.PersistentFlags().StringVar(&cfgPath, "config", "", "")
	budget := byteSize(engine.DefaultMemoryBudget)
	runCmd := newRunCmd(io.Discard, &budget)
	runCmd.RunE = func(cmd *cobra.Command, _ []string) error { got = cmd; return nil }
	root.AddCommand(runCmd, newVerifyCmd(io.Discard, io.Discard))
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error { return applyConfig(root, cmd, cfgPath) }
	root.SetArgs([]string{"run", "--config", path, "--target", "postgres://from-flag/tgt"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	f := got.Flags()
	for flag, want := range map[string]string{"source": "postgres://from-file/src", "target": "postgres://from-flag/tgt",
		"tables": "[app.*,billing.invoices]", "tombstone-retention": "48h0m0s", "live-suffix": "_now"} {
		if v := f.Lookup(flag).Value.String(); v != want {
			t.Errorf("--%s = %q, want %q", flag, v, want)
		}
	}

	for body, want := range map[string]string{
		"sorce: x\n":              "sorce: no pgconverge command has a flag --sorce",
		"run:\n  repair: true\n":  "run.repair: pgconverge run has no flag --repair",
		"run:\n  slot: [a, b]\n":  "--slot takes one value, not a list",
		"run:\n  workers: many\n": "run.workers",
	} {
		root.SetArgs([]string{"run", "--config", writeConfig(t, body)})
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("settings %q: error %v, want one mentioning %q", body, err, want)
		}
	}
}

// --memory-budget takes sizes with units and refuses what it cannot read or what is too small to
// work in, before anything connects.
func TestMemoryBudgetFlag(t *testing.T) {
	for _, c := range []struct{ arg, want string }{
		{"64MiB", "64 MiB"},
		{"1GB", "954 MiB"},
		{"268435456", "256 MiB"},
	} {
		b := byteSize(0)
		if err := b.Set(c.arg); err != nil || b.String() != c.want {
			t.Errorf("--memory-budget %s = %s (%v), want %s", c.arg, b.String(), err, c.want)
		}
	}
	for _, c := range []struct{ arg, want string }{
		{"8MiB", "below the least budget, 16MiB"},
		{"lots", `"lots" is not a size`},
	} {
		err := run(context.Background(), []string{"coverage", "--memory-budget", c.arg, "--source", "postgres://127.0.0.1:1/x", "--target", "postgres://127.0.0.1:1/x"}, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--memory-budget %s: %v, want an error saying %q", c.arg, err, c.want)
		}
	}
}
