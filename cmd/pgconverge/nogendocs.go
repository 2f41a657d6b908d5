//go:build !gendocs

package main

import "github.com/spf13/cobra"

// devCommands returns no command: the hidden gen-docs command exists only in a binary built with
// the gendocs tag (gendocs.go), so released binaries carry no documentation generator.
func devCommands(*cobra.Command) []*cobra.Command { return nil }
