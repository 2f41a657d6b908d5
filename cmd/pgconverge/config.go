package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// Settings files (--config FILE): YAML whose keys are the commands' own flag names, so that the
// flags stay the one list of settings and their help the one documentation:
//
//	source: postgres://pgconverge@db1/app          # any command that has --source
//	target: postgres://pgconverge@db2/app_replica
//	run:                                            # only `pgconverge run`
//	  tables: [app.*, billing.invoices]
//	  metrics-addr: 127.0.0.1:9187
//	  tombstone-retention: 48h
//
// A top-level key applies to the running command when it has that flag (a key no command has is
// an error); a section named after a command applies to that command only (a key it lacks is an
// error). A flag given on the command line, or by its environment variable (PGCONVERGE_SOURCE,
// PGCONVERGE_TARGET), wins over the file; a list (a flag that may be
// repeated) takes the file's list; a value is given as the flag would be, durations as "90s".

// applyConfig sets the flags of cmd that the settings file at path gives and the command line
// did not; root lists every command, to tell a misspelt top-level key from one for another
// command. The error names the file and the key.
func applyConfig(root, cmd *cobra.Command, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	commands := map[string]*cobra.Command{}
	for _, c := range root.Commands() {
		commands[c.Name()] = c
	}
	var errs []error
	for key, v := range doc {
		if section, ok := commands[key]; ok {
			m, ok := v.(map[string]any)
			if !ok {
				errs = append(errs, fmt.Errorf("--config %s: %s: want a mapping of %s's flags", path, key, key))
				continue
			}
			if section != cmd {
				continue
			}
			for k, sv := range m {
				if f := cmd.Flags().Lookup(k); f == nil {
					errs = append(errs, fmt.Errorf("--config %s: %s.%s: pgconverge %s has no flag --%s", path, key, k, key, k))
				} else {
					errs = append(errs, setFromConfig(f, path, key+"."+k, sv))
				}
			}
			continue
		}
		if f := cmd.Flags().Lookup(key); f != nil {
			errs = append(errs, setFromConfig(f, path, key, v))
			continue
		}
		if !slices.ContainsFunc(root.Commands(), func(c *cobra.Command) bool { return c.Flags().Lookup(key) != nil }) {
			errs = append(errs, fmt.Errorf("--config %s: %s: no pgconverge command has a flag --%s", path, key, key))
		}
	}
	return errors.Join(errs...)
}

// envFlags are the flags whose default comes from an environment variable, which wins over the
// settings file as the command line does.
var envFlags = map[string]string{"source": "PGCONVERGE_SOURCE", "target": "PGCONVERGE_TARGET", "primary": "PGCONVERGE_PRIMARY"}

// setFromConfig sets flag f from the settings file's value v at key, unless the command line or
// its environment variable set it.
func setFromConfig(f *pflag.Flag, path, key string, v any) error {
	if f.Changed || f.Name == "config" || envFlags[f.Name] != "" && os.Getenv(envFlags[f.Name]) != "" {
		return nil
	}
	values := []any{v}
	if list, ok := v.([]any); ok {
		if !strings.HasSuffix(f.Value.Type(), "Array") && !strings.HasSuffix(f.Value.Type(), "Slice") {
			return fmt.Errorf("--config %s: %s: --%s takes one value, not a list", path, key, f.Name)
		}
		values = list
	}
	for _, one := range values {
		if _, isMap := one.(map[string]any); isMap || one == nil {
			return fmt.Errorf("--config %s: %s: want a value for --%s", path, key, f.Name)
		}
		if err := f.Value.Set(fmt.Sprint(one)); err != nil {
			return fmt.Errorf("--config %s: %s: %w", path, key, err)
		}
	}
	f.Changed = true
	return nil
}
