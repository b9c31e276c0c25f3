package main

import (
	"regexp"
	"testing"

	"github.com/questrt/questrt/internal/buildinfo"
)

// TestVersion: questctl version prints one line in the shared format and
// exits 0; a stray argument is a usage error.
func TestVersion(t *testing.T) {
	code, stdout, stderr := runCLI(t, "version")
	want := buildinfo.Read().String() + "\n"
	if code != 0 || stderr != "" || stdout != want {
		t.Errorf("version: exit %d, stdout %q (want %q), stderr %q", code, stdout, want, stderr)
	}
	if !regexp.MustCompile(`^questrt \S+ \(revision \S+, go go\S+\)\n$`).MatchString(stdout) {
		t.Errorf("version line %q is not in the format", stdout)
	}
	if code, _, stderr := runCLI(t, "version", "extra"); code != 2 || stderr == "" {
		t.Errorf("version extra: exit %d, stderr %q", code, stderr)
	}
}
