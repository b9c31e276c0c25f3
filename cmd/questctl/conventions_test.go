package main

import (
	"strings"
	"testing"
)

// TestHelpAndErrorStreams: every command's --help goes to stdout (exit 0,
// nothing on stderr); an unknown flag is one line on stderr naming it,
// with nothing on stdout (exit 2).
func TestHelpAndErrorStreams(t *testing.T) {
	for _, cmd := range [][]string{
		{"demo"}, {"replay"}, {"replay", "gen"}, {"bench", "attention"}, {"bench", "collective"},
		{"bench", "selection"}, {"devices"}, {"generate"}, {"eval", "passkey"},
	} {
		code, stdout, stderr := runCLI(t, append(cmd, "--help")...)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage: questctl "+strings.Join(cmd, " ")) || !strings.Contains(stdout, "Flags:") {
			t.Errorf("%v --help: exit %d, stderr %q, stdout starts %.60q", cmd, code, stderr, stdout)
		}
		code, stdout, stderr = runCLI(t, append(cmd, "--no-such-flag")...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "no-such-flag") {
			t.Errorf("%v --no-such-flag: exit %d, stdout %q, stderr %q", cmd, code, stdout, stderr)
		}
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"bench", "--help"}} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "Usage") {
			t.Errorf("%v: exit %d, stderr %q, stdout %.60q", args, code, stderr, stdout)
		}
	}
}
