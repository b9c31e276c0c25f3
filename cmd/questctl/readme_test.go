package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readmeSmall are the flags TestReadmeCommands appends to the README's
// commands so that they run in seconds (the README says which commands the
// test shrinks). Later flags win, so these override the README's sizes.
var readmeSmall = map[string][]string{
	"demo": {"--context", "4096", "--steps", "2", "--layers", "3", "--dense-layers", "1", "--q-heads", "8", "--kv-heads", "2",
		"--head-dim", "32", "--budget", "256", "--mentions", "8", "--needles", "2"},
	"bench attention":  {"--context", "4096", "--q-heads", "8", "--kv-heads", "2", "--head-dim", "32", "--iters", "2", "--budget", "256"},
	"bench collective": {"--shards", "2", "--batch", "1", "--steps", "20"},
	"bench selection":  {"--cp", "2", "--context", "4096", "--q-heads", "8", "--kv-heads", "2", "--head-dim", "32", "--budget", "256", "--steps", "2"},
}

// TestReadmeCommands runs every command of the README's Quickstart and
// "Build and run" sections, so the README cannot drift from the code:
// questctl commands run in process (from a scratch directory that sees the
// repository's examples/), with the sizes of readmeSmall; go build and go
// test commands run as given (benchmarks once, fuzz targets on their seed
// corpus); `go test ./...` is this test's own command and is skipped, as
// are the lines for a GPU host (cuda), which run on the device machine.
func TestReadmeCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("runs builds and small demos")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeCommands(t, filepath.Join(root, "README.md"), "Quickstart", "Build and run")
	if len(cmds) < 5 {
		t.Fatalf("found only %d commands in the README: has its layout changed?", len(cmds))
	}
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(root, "examples"), filepath.Join(dir, "examples")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	ran := 0
	for _, line := range cmds {
		if strings.Contains(line, "cuda") || strings.Contains(line, "nvcc") || strings.Contains(line, "gpu.test") {
			continue // GPU host only (the cuda build's test binaries too)
		}
		words := splitShell(t, line)
		switch {
		case len(words) >= 2 && words[0] == "go" && (words[1] == "build" || words[1] == "test"):
			if line == "go test ./..." {
				continue
			}
			goCommand(t, root, dir, words)
		case words[0] == "questctl" || words[0] == "./questctl" ||
			len(words) >= 3 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/questctl":
			if words[0] == "go" {
				words = words[2:]
			}
			args := words[1:]
			name := args[0]
			if name == "bench" && len(args) > 1 {
				name += " " + args[1]
			}
			if !strings.Contains(line, "--help") {
				args = append(args, readmeSmall[name]...)
			}
			code := run(context.Background(), args, io.Discard, io.Discard)
			if code != 0 {
				var errb strings.Builder
				run(context.Background(), args, io.Discard, &errb)
				t.Errorf("README command %q (run as %q): exit %d: %s", line, args, code, errb.String())
			}
		default:
			t.Errorf("README command %q: the test does not know how to run it; teach readme_test.go", line)
			continue
		}
		ran++
	}
	t.Logf("ran %d README commands", ran)
}

// goCommand runs a go build or go test line of the README from the
// repository root, with outputs (-o) in dir, benchmarks once and fuzz
// targets on their seed corpus only.
func goCommand(t *testing.T, root, dir string, words []string) {
	t.Helper()
	var args []string
	for i := 1; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "-o" && i+1 < len(words):
			args = append(args, "-o", dir+string(os.PathSeparator))
			i++
		case w == "-fuzz" && i+1 < len(words):
			args = append(args, "-run", words[i+1])
			i++
		default:
			args = append(args, w)
		}
	}
	if args[0] == "test" && strings.Contains(strings.Join(args, " "), "-bench") {
		args = append(args, "-benchtime", "1x")
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("README command %q (run as go %q): %v\n%s", strings.Join(words, " "), args, err, out)
	}
}

// readmeCommands returns the command lines of the sh blocks under the
// given level-2 headings (and their subsections), comments stripped.
func readmeCommands(t *testing.T, path string, sections ...string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	in, block := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if h, ok := strings.CutPrefix(l, "## "); ok && !block {
			in = false
			for _, s := range sections {
				in = in || strings.TrimSpace(h) == s
			}
			continue
		}
		if strings.HasPrefix(l, "```") {
			block = !block && strings.TrimPrefix(l, "```") == "sh"
			continue
		}
		if !in || !block {
			continue
		}
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// splitShell splits a command line into words, honouring single and
// double quotes; anything fancier (pipes, $, [optional] synopses) is an
// error, so the README keeps runnable blocks runnable.
func splitShell(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var cur strings.Builder
	quote, inWord := rune(0), false
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case strings.ContainsRune("|&;<>$`[]", r):
			t.Fatalf("README command %q is not a plain command (put synopses in a text block)", line)
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}
