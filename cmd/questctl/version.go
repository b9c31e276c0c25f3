package main

import (
	"fmt"
	"io"

	"github.com/questrt/questrt/internal/buildinfo"
)

// runVersion prints the one-line version of the binary:
// "questrt VERSION (revision REV, go GOVERSION)" (internal/buildinfo).
func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", `Usage: questctl version

Prints questctl's version in one line: the questrt module version, the VCS
revision it was built from ("-dirty" when the work tree had changes) and
the Go version: questrt VERSION (revision REV, go GOVERSION). A build
without that information says (devel) and unknown.`)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	_, err := fmt.Fprintln(stdout, buildinfo.Read())
	return err
}
