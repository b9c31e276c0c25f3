package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/questrt/questrt/internal/buildinfo"
)

// runVersion prints the one-line version of the binary:
// "questrt VERSION (revision REV, go GOVERSION)" (internal/buildinfo).
func runVersion(args []string, stdout, stderr io.Writer) error {
	return runCommand(context.Background(), versionCommand, args, stdout, stderr)
}

// versionCommand builds the flags and the action of
// 'questctl version' without running it (see [runCommand]).
func versionCommand() (*flag.FlagSet, action) {
	fs := newFlags("version", `Usage: questctl version

Prints questctl's version in one line: the questrt module version, the VCS
revision it was built from ("-dirty" when the work tree had changes) and
the Go version: questrt VERSION (revision REV, go GOVERSION). A build
without that information says (devel) and unknown.`)
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		_, err := fmt.Fprintln(stdout, buildinfo.Read())
		return err
	}
}
