package main

import (
	"flag"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestHelpAndErrorStreams: every command's --help (every command of the
// table that completion is made from) goes to stdout (exit 0, nothing on
// stderr); an unknown flag is one line on stderr naming it, with nothing
// on stdout (exit 2).
func TestHelpAndErrorStreams(t *testing.T) {
	for _, c := range commands() {
		cmd := strings.Fields(c.name)
		code, stdout, stderr := runCLI(t, append(cmd, "--help")...)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage: questctl "+strings.Join(cmd, " ")) || !strings.Contains(stdout, "Flags:") {
			t.Errorf("%v --help: exit %d, stderr %q, stdout starts %.60q", cmd, code, stderr, stdout)
		}
		code, stdout, stderr = runCLI(t, append(cmd, "--no-such-flag")...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "no-such-flag") {
			t.Errorf("%v --no-such-flag: exit %d, stdout %q, stderr %q", cmd, code, stdout, stderr)
		}
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"bench", "--help"}, {"eval", "--help"}, {"completion", "--help"}} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "Usage") {
			t.Errorf("%v: exit %d, stderr %q, stdout %.60q", args, code, stderr, stdout)
		}
	}
}

// flagsOf builds the flag set of the table's command name.
func flagsOf(t *testing.T, name string) *flag.FlagSet {
	t.Helper()
	for _, c := range commands() {
		if c.name == name {
			fs, _ := c.build()
			return fs
		}
	}
	t.Fatalf("no command %q in the table", name)
	return nil
}

// TestKVCacheDTypeShared: the commands that store a KV cache on the GPU
// (demo, replay, bench attention, bench decode, bench offload, generate, and no other) take --kv-cache-dtype
// with one default, bf16, and --dtype as its deprecated alias: the same
// value, a one-line warning on stderr, documented in the help.
func TestKVCacheDTypeShared(t *testing.T) {
	var with []string
	for _, c := range commands() {
		fs, _ := c.build()
		f := fs.Lookup("kv-cache-dtype")
		if f == nil {
			if fs.Lookup("dtype") != nil {
				t.Errorf("%s has --dtype without --kv-cache-dtype", c.name)
			}
			continue
		}
		with = append(with, c.name)
		if f.DefValue != "bf16" {
			t.Errorf("%s: --kv-cache-dtype defaults to %q, want bf16", c.name, f.DefValue)
		}
		d := fs.Lookup("dtype")
		if d == nil {
			t.Errorf("%s: no --dtype alias of --kv-cache-dtype", c.name)
			continue
		}
		if a, ok := d.Value.(*aliasValue); !ok || !a.deprecated || a.canonical != "kv-cache-dtype" {
			t.Errorf("%s: --dtype is not the deprecated alias of --kv-cache-dtype", c.name)
			continue
		}
		if err := fs.Parse([]string{"--dtype", "f16"}); err != nil || f.Value.String() != "f16" {
			t.Errorf("%s --dtype f16: --kv-cache-dtype %q, %v", c.name, f.Value.String(), err)
		}
		// fp8 pages are decoded on the GPU (bench decode), never filled
		// or prefilled there.
		if err := fs.Parse([]string{"--kv-cache-dtype", "fp8"}); (err == nil) != (c.name == "bench decode") {
			t.Errorf("%s --kv-cache-dtype fp8: error %v", c.name, err)
		}
		_, help, _ := runCLI(t, append(strings.Fields(c.name), "--help")...)
		if !strings.Contains(help, "-kv-cache-dtype type") || !strings.Contains(help, "(default bf16)") ||
			!strings.Contains(help, "-dtype value\n    \tdeprecated: the older name of --kv-cache-dtype") {
			t.Errorf("%s --help does not document --kv-cache-dtype and --dtype:\n%s", c.name, help)
		}
	}
	if want := []string{"demo", "replay", "bench attention", "bench decode", "bench offload", "generate"}; !slices.Equal(with, want) {
		t.Errorf("commands with --kv-cache-dtype: %v, want %v", with, want)
	}

	// The deprecated name works and warns, in one line, before anything
	// else the command says.
	for _, args := range [][]string{
		{"demo", "--dtype", "f16"},
		{"bench", "attention", "--dtype", "f16"},
		{"replay", "--in", exampleCase, "--dtype", "f16"},
	} {
		name := args[0]
		if name == "bench" {
			name += " " + args[1]
		}
		code, stdout, stderr := runCLICancelled(t, args...)
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		warn := "questctl " + name + ": --dtype is deprecated: use --kv-cache-dtype (the same values)"
		if code != 2 || stdout != "" || len(lines) != 2 || lines[0] != warn || !strings.Contains(lines[1], "--dtype needs --backend cuda") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want the warning %q, then the usage error", args, code, stdout, stderr, warn)
		}
	}
	if code, _, stderr := runCLI(t, "demo", "--kv-cache-dtype", "fp8"); code != 2 || stderr != "questctl demo: --kv-cache-dtype \"fp8\": want f32, f16 or bf16 (fp8: bench decode only) (see 'questctl demo --help')\n" {
		t.Errorf("demo --kv-cache-dtype fp8: exit %d, stderr %q", code, stderr)
	}
}

// TestReplayCUDANeedsDType: replay cases hold float32 K and V, compared
// against the CPU backend: with --backend cuda, replay refuses the shared
// default (bf16) unless --kv-cache-dtype (or --dtype) is given.
func TestReplayCUDANeedsDType(t *testing.T) {
	code, stdout, stderr := runCLI(t, "replay", "--in", exampleCase, "--backend", "cuda")
	if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 ||
		!strings.Contains(stderr, "--backend cuda: give --kv-cache-dtype: f32 reproduces the CPU backend's result") {
		t.Errorf("replay --backend cuda: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// Given, it goes on to the backend (in a CPU build: how to build one).
	code, _, stderr = runCLI(t, "replay", "--in", exampleCase, "--backend", "cuda", "--kv-cache-dtype", "f32")
	if code == 0 || strings.Contains(stderr, "give --kv-cache-dtype") {
		t.Errorf("replay --backend cuda --kv-cache-dtype f32: exit %d, stderr %q", code, stderr)
	}
}

// TestGridAliases: wherever a command has --tp and --cp (the grid's
// degrees), --tensor-parallel-size and --decode-context-parallel-size
// (vLLM's names) set the same values; bench selection's --cp, a list of
// degrees to sweep, has no alias.
func TestGridAliases(t *testing.T) {
	aliases := map[string]string{"tp": "tensor-parallel-size", "cp": "decode-context-parallel-size"}
	var with []string
	for _, c := range commands() {
		fs, _ := c.build()
		for flagName, alias := range aliases {
			f, a := fs.Lookup(flagName), fs.Lookup(alias)
			if f == nil {
				if a != nil {
					t.Errorf("%s has --%s without --%s", c.name, alias, flagName)
				}
				continue
			}
			if c.name == "bench selection" && flagName == "cp" {
				if a != nil {
					t.Errorf("bench selection: --%s on the list of CP degrees", alias)
				}
				continue
			}
			if a == nil {
				t.Errorf("%s: --%s has no alias --%s", c.name, flagName, alias)
				continue
			}
			if flagName == "tp" {
				with = append(with, c.name)
			}
			if err := fs.Parse([]string{"--" + alias, "3"}); err != nil || f.Value.String() != "3" {
				t.Errorf("%s --%s 3: --%s %q, %v", c.name, alias, flagName, f.Value.String(), err)
			}
			if err := fs.Parse([]string{"--" + alias, "x"}); err == nil || !strings.Contains(flagError(fs, err), "--"+alias+` "x": not an integer`) {
				t.Errorf("%s --%s x: %v", c.name, alias, err)
			}
		}
	}
	if want := []string{"demo", "replay", "generate", "eval passkey", "calibrate", "up"}; !slices.Equal(with, want) {
		t.Errorf("commands with --tp: %v, want %v", with, want)
	}

	// The same result through either name.
	_, byFlag, e1 := runCLI(t, "replay", "--in", exampleCase, "--cp", "2", "--tp", "2")
	code, byAlias, e2 := runCLI(t, "replay", "--in", exampleCase, "--decode-context-parallel-size", "2", "--tensor-parallel-size", "2")
	if code != 0 || byAlias != byFlag || e1 != "" || e2 != "" {
		t.Errorf("replay by vLLM's names: exit %d, stderr %q / %q, same result %v", code, e1, e2, byAlias == byFlag)
	}
	// Errors name the flag as given.
	if code, _, stderr := runCLI(t, "calibrate", "--model", "x", "--lengths", "64", "--tensor-parallel-size", "2"); code != 2 ||
		!strings.Contains(stderr, "--tensor-parallel-size: calibrate runs dense attention in process") {
		t.Errorf("calibrate --tensor-parallel-size: exit %d, stderr %q", code, stderr)
	}
	// questctl up sets the grid of its nodes: its questd flags after "--"
	// may not, by either name.
	for _, f := range []string{"--tensor-parallel-size", "--decode-context-parallel-size=2"} {
		if code, _, stderr := runCLI(t, "up", "--nodes", "1", "--", f, "2"); code != 2 || !strings.Contains(stderr, "questctl up sets it for every node") {
			t.Errorf("up -- %s: exit %d, stderr %q", f, code, stderr)
		}
	}
	// The help lists the aliases.
	_, help, _ := runCLI(t, "demo", "--help")
	if !strings.Contains(help, "-tensor-parallel-size value\n    \tthe same as --tp (vLLM's name)") {
		t.Errorf("demo --help lacks --tensor-parallel-size:\n%s", help)
	}
}

// TestTopUsageListsCommands: questctl --help names every benchmark that
// bench runs (decode included: it prints its help in every build) and
// both ways calibrate takes its prompts (--prompts or --lengths).
func TestTopUsageListsCommands(t *testing.T) {
	for _, name := range []string{"attention", "collective", "decode", "offload", "selection", "serve"} {
		if !regexp.MustCompile(`(?m)^  questctl bench +` + name + ` `).MatchString(usage) {
			t.Errorf("questctl --help has no line for bench %s", name)
		}
	}
	if !strings.Contains(usage, "questctl calibrate --model DIR --prompts F|--lengths L") {
		t.Errorf("questctl --help: calibrate's line does not say --prompts F|--lengths L")
	}
}
