package main

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// script returns 'questctl completion shell', checking the conventions:
// exit 0, the script on stdout, nothing on stderr.
func script(t *testing.T, shell string) string {
	t.Helper()
	code, stdout, stderr := runCLI(t, "completion", shell)
	if code != 0 || stderr != "" || len(stdout) < 1000 {
		t.Fatalf("completion %s: exit %d, stderr %q, %d bytes", shell, code, stderr, len(stdout))
	}
	return stdout
}

// writeScript writes the script of shell to a temporary file.
func writeScript(t *testing.T, shell string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "questctl."+shell)
	if err := os.WriteFile(p, []byte(script(t, shell)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// tableFlags returns, for every command of the table, the flags its flag
// set accepts, and --help.
func tableFlags() map[string][]string {
	out := map[string][]string{}
	for _, c := range commands() {
		fs, _ := c.build()
		fs.VisitAll(func(f *flag.Flag) { out[c.name] = append(out[c.name], f.Name) })
		out[c.name] = append(out[c.name], "help")
	}
	return out
}

// TestCompletionFlags: every flag every command accepts is in each
// shell's script, in that command's part of it (the scripts are made from
// the commands' flag sets).
func TestCompletionFlags(t *testing.T) {
	flags := tableFlags()
	if len(flags) < 17 {
		t.Fatalf("the table has %d commands", len(flags))
	}
	bash, zsh, fish := script(t, "bash"), script(t, "zsh"), script(t, "fish")
	for name, fl := range flags {
		m := regexp.MustCompile(`(?m)^    '` + name + `'\)\n        flags='([^']*)'\n`).FindStringSubmatch(bash)
		if m == nil {
			t.Errorf("bash: no part for %q", name)
			continue
		}
		bashFlags := strings.Fields(m[1])
		i := strings.Index(zsh, "\n    ('"+name+"')\n")
		if i < 0 {
			t.Errorf("zsh: no part for %q", name)
			continue
		}
		zshPart := zsh[i:]
		zshPart = zshPart[:strings.Index(zshPart, "\n        ;;\n")]
		for _, f := range fl {
			if !slices.Contains(bashFlags, "--"+f) {
				t.Errorf("bash: %s lacks --%s", name, f)
			}
			if !regexp.MustCompile(`(?m)^            '(\([^)]*\))?--` + regexp.QuoteMeta(f) + `[=\[]`).MatchString(zshPart) {
				t.Errorf("zsh: %s lacks --%s", name, f)
			}
			if !strings.Contains(fish, `complete -c questctl -n '__questctl_using \'`+name+`\'' -l `+f+" ") {
				t.Errorf("fish: %s lacks --%s", name, f)
			}
		}
	}
}

// TestCompletionSyntax: the scripts parse (bash -n, zsh -n, fish
// --no-execute; shells not installed are skipped).
func TestCompletionSyntax(t *testing.T) {
	for shell, args := range map[string][]string{"bash": {"-n"}, "zsh": {"-n"}, "fish": {"--no-execute"}} {
		t.Run(shell, func(t *testing.T) {
			bin, err := exec.LookPath(shell)
			if err != nil {
				t.Skipf("%s is not installed: its script's syntax is not checked", shell)
			}
			p := writeScript(t, shell)
			cmd := exec.Command(bin, append(args, p)...)
			cmd.Env = shellEnv(t)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s %v: %v\n%s", shell, args, err, out)
			}
		})
	}
}

// shellEnv is an environment for the shells: a scratch HOME (fish writes
// its history and variables under it).
func shellEnv(t *testing.T) []string {
	home := t.TempDir()
	return append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"),
		"XDG_DATA_HOME="+filepath.Join(home, ".local", "share"), "XDG_CACHE_HOME="+filepath.Join(home, ".cache"))
}

// completions is what the shell completes for each line (the last word is
// the one completed, "" a new word), from the script loaded in it.
func completions(t *testing.T, shell string, lines []string) [][]string {
	t.Helper()
	bin, err := exec.LookPath(shell)
	if err != nil {
		t.Skipf("%s is not installed", shell)
	}
	p := writeScript(t, shell)
	var prog strings.Builder
	switch shell {
	case "bash":
		prog.WriteString("source " + p + "\n")
		for _, l := range lines {
			prog.WriteString("COMP_WORDS=(" + l + "); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n")
			prog.WriteString("_questctl; echo \"${COMPREPLY[*]}\"\n")
		}
	case "fish":
		prog.WriteString("source " + p + "\n")
		for _, l := range lines {
			// complete -C prints "candidate\tdescription" lines.
			prog.WriteString("echo (complete -C " + fishQuote(fishLine(l)) + " | string replace -r '\\t.*' '')\n")
		}
	}
	cmd := exec.Command(bin, "-c", prog.String())
	cmd.Env = shellEnv(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", shell, err, out)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(got) != len(lines) {
		t.Fatalf("%s: %d lines of completions for %d command lines:\n%s", shell, len(got), len(lines), out)
	}
	res := make([][]string, len(got))
	for i, g := range got {
		res[i] = strings.Fields(g)
	}
	return res
}

// fishLine turns a bash array literal of words, where a quoted empty
// word is the word being started, into the command line fish completes.
func fishLine(l string) string { return strings.ReplaceAll(l, "''", "") }

// TestCompletionWorks: in bash and fish (zsh needs a terminal), the
// script completes the commands, the subcommands, every command's flags
// and the values of --kv-cache-dtype.
func TestCompletionWorks(t *testing.T) {
	flags := tableFlags()
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	lines := []string{"questctl ''", "questctl be", "questctl bench ''", "questctl replay ''", "questctl completion ''", "questctl tls ''",
		"questctl demo --kv-cache-dtype ''", "questctl bench attention --dtype b", "questctl demo --tens"}
	want := [][]string{
		{"demo", "replay", "bench", "devices", "generate", "eval", "calibrate", "plot", "up", "status", "tls", "replay-request", "version", "completion", "help"},
		{"bench"}, {"attention", "collective", "decode", "offload", "selection", "serve"}, {"gen"}, {"bash", "zsh", "fish"}, {"ca", "node", "client"},
		{"f32", "f16", "bf16"}, {"bf16"}, {"--tensor-parallel-size"},
	}
	for _, name := range names {
		lines = append(lines, "questctl "+name+" --")
		var w []string
		for _, f := range flags[name] {
			w = append(w, "--"+f)
		}
		want = append(want, w)
	}
	for _, shell := range []string{"bash", "fish"} {
		t.Run(shell, func(t *testing.T) {
			got := completions(t, shell, lines)
			for i := range lines {
				g, w := slices.Clone(got[i]), slices.Clone(want[i])
				slices.Sort(g)
				slices.Sort(w)
				if !slices.Equal(g, w) {
					t.Errorf("%s completes %s to %q, want %q", shell, fishLine(lines[i]), got[i], want[i])
				}
			}
		})
	}
}

// TestCompletionUsage: 'questctl completion' wants a shell it knows;
// --help, before or after the shell, prints how to load the script.
func TestCompletionUsage(t *testing.T) {
	for _, args := range [][]string{{"completion"}, {"completion", "tcsh"}, {"completion", "bash", "extra"}, {"completion", "zsh", "--x"}} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	code, stdout, _ := runCLI(t, "completion", "--help")
	if code != 0 || !strings.HasPrefix(stdout, "Usage: questctl completion bash|zsh|fish") {
		t.Errorf("completion --help: exit %d, %q", code, stdout)
	}
	for shell, how := range map[string]string{"bash": "source <(questctl completion bash)", "zsh": "_questctl", "fish": "questctl completion fish | source"} {
		if code, stdout, _ := runCLI(t, "completion", shell, "--help"); code != 0 || !strings.Contains(stdout, how) {
			t.Errorf("completion %s --help: exit %d, lacks %q:\n%s", shell, code, how, stdout)
		}
	}
}
