//go:build gendocs

package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// devCommands returns, in a binary built with the gendocs tag only, the hidden gen-docs command,
// which writes root's Markdown reference (one file per command, pgconverge.md first) into a
// directory; scripts/gen-cli-docs.sh runs it to write docs/cli, and scripts/test.sh to check that
// docs/cli is current. Released binaries are built without the tag and carry no generator.
func devCommands(root *cobra.Command) []*cobra.Command {
	return []*cobra.Command{{
		Use:    "gen-docs DIR",
		Short:  "Write the Markdown CLI reference into DIR (one file per command)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return fmt.Errorf("create docs directory: %w", err)
			}
			disableAutoGenTag(root)
			if err := doc.GenMarkdownTree(root, args[0]); err != nil {
				return fmt.Errorf("generate CLI docs: %w", err)
			}
			return nil
		},
	}}
}

// disableAutoGenTag sets DisableAutoGenTag on cmd and every command under it, so the generated
// files carry no date and regenerate byte for byte.
func disableAutoGenTag(cmd *cobra.Command) {
	cmd.DisableAutoGenTag = true
	for _, c := range cmd.Commands() {
		disableAutoGenTag(c)
	}
}
