package main

import (
	"errors"
	"os"

	"github.com/spf13/pflag"
)

// addURLFlags defines --source and --target, which default to $PGCONVERGE_SOURCE and
// $PGCONVERGE_TARGET.
func addURLFlags(f *pflag.FlagSet, source, target *string) {
	f.StringVar(source, "source", os.Getenv("PGCONVERGE_SOURCE"), "source PostgreSQL URL ($PGCONVERGE_SOURCE)")
	f.StringVar(target, "target", os.Getenv("PGCONVERGE_TARGET"), "target PostgreSQL URL ($PGCONVERGE_TARGET)")
}

// validateURLs returns the problems of a source and target URL pair: missing, or the same.
func validateURLs(source, target string) []error {
	var errs []error
	if source == "" {
		errs = append(errs, errors.New("no source: pass --source URL or set PGCONVERGE_SOURCE"))
	}
	if target == "" {
		errs = append(errs, errors.New("no target: pass --target URL or set PGCONVERGE_TARGET"))
	}
	if source != "" && source == target {
		errs = append(errs, errors.New("source and target are the same URL: they must be two different databases"))
	}
	return errs
}

// addLogFlags defines --log-format and --log-level (see newLogger).
func addLogFlags(f *pflag.FlagSet, format, level *string) {
	f.StringVar(format, "log-format", "auto", "log format: auto (text on a terminal, else json), text or json")
	f.StringVar(level, "log-level", "info", "log level: debug, info, warn or error")
}
