package main

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// helpOf returns the --help text of one flag of a command: its line and
// the indented lines under it, up to the next flag.
func helpOf(t *testing.T, cmd []string, name string) string {
	t.Helper()
	code, out, errs := runCLI(t, append(append([]string{}, cmd...), "--help")...)
	if code != 0 {
		t.Fatalf("%q --help: exit %d, %s", cmd, code, errs)
	}
	var b strings.Builder
	in := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "  -"+name+" ") || line == "  -"+name:
			in = true
		case strings.HasPrefix(line, "  -"):
			in = false
		}
		if in {
			b.WriteString(strings.TrimSpace(line) + " ")
		}
	}
	return b.String()
}

// TestBoundsRefused: the process counts, grid degrees, sizes and
// durations of up, demo, replay and bench have a range, given in the
// flag's --help, and a value past it exits 2 with one line naming the
// flag and the range before anything is written or started: the fake
// questd (a script that leaves a mark) never runs and no temporary
// directory is left (issue 28: demo --nodes 100000 started 188 questd
// processes and left its log directory behind).
func TestBoundsRefused(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the fake questd is a shell script")
	}
	dir := t.TempDir()
	mark := filepath.Join(dir, "started")
	questd := filepath.Join(dir, "questd")
	if err := os.WriteFile(questd, []byte("#!/bin/sh\ntouch '"+mark+"'\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	caseFile := filepath.Join("..", "..", "examples", "replay", "case.json")
	for _, c := range []struct {
		cmd        []string // the command and its other flags
		flag, val  string
		want, help string // in the error; in the flag's --help
	}{
		{[]string{"demo", "--questd", questd}, "nodes", "100000", "want 0 (in process) or 1..64", "0..64"},
		{[]string{"demo", "--questd", questd}, "nodes", "-1", "want 0 (in process) or 1..64", "0..64"},
		{[]string{"up", "--questd", questd, "--insecure"}, "nodes", "100000", "want 1..64", "1..64"},
		{[]string{"up", "--questd", questd}, "nodes", "65", "want 1..64", "1..64"},
		{[]string{"up", "--questd", questd, "--nodes", "2"}, "cp", "100000", "want 1..4096", "1..4096"},
		{[]string{"up", "--questd", questd, "--nodes", "2"}, "tp", "1025", "want 1..1024", "1..1024"},
		{[]string{"up", "--questd", questd, "--nodes", "2"}, "timeout", "2h", "at most 1h0m0s", "at most 1h0m0s"},
		{[]string{"up", "--questd", questd, "--nodes", "2"}, "stop-timeout", "2h", "at most 1h0m0s", "at most 1h0m0s"},
		{[]string{"demo"}, "kv-heads", "1025", "want 1..1024", "1..1024"},
		{[]string{"demo"}, "mentions", "1073741825", "want 1..1073741824", "1..1073741824"},
		{[]string{"demo"}, "page-size", "1073741825", "want 1..1073741824", "1..1073741824"},
		{[]string{"replay", "--in", caseFile}, "timeout", "2h", "at most 1h0m0s", "at most 1h0m0s"},
		{[]string{"replay", "--in", caseFile}, "timeout", "-1s", "want above 0", "above 0"},
		{[]string{"bench", "serve", "--addr", "127.0.0.1:1"}, "budget", "1073741825", "up to 1073741824", "at most 1073741824"},
		{[]string{"bench", "serve", "--addr", "127.0.0.1:1"}, "timeout", "25h", "at most 24h0m0s", "at most 24h0m0s"},
		{[]string{"bench", "collective"}, "head-dim", "16385", "want 1 to 16384", "1 to 16384"},
		{[]string{"bench", "collective"}, "pages", "16777217", "want 1 to 16777216", "1 to 16777216"},
		{[]string{"bench", "collective"}, "steps", "16777217", "want 1 to 16777216", "1 to 16777216"},
		{[]string{"bench", "collective"}, "shards", "1025", "want 1 to 1024", "1 to 1024"},
		{[]string{"bench", "collective"}, "factor", "1025", "want 2 to 1024", "2 to 1024"},
		{[]string{"bench", "attention"}, "head-dim", "4097", "want 1..4096", "1..4096"},
		{[]string{"bench", "selection"}, "steps", "1000001", "want 1..1000000", "1..1000000"},
		{[]string{"bench", "offload"}, "steps", "1000001", "want 1..1000000", "1..1000000"},
		{[]string{"replay", "gen"}, "head-dim", "4097", "want 1..4096", "1..4096"},
		{[]string{"bench", "decode", "--config", "x.json"}, "budget", "1073741825", "one page..1073741824", "--page-size..1073741824"},
		{[]string{"bench", "decode", "--config", "x.json"}, "dense-layers", "1025", "dense layers 0..1024", "0..1024"},
	} {
		t.Run(strings.Join(c.cmd[:min(2, len(c.cmd))], " ")+" --"+c.flag+"="+c.val, func(t *testing.T) {
			os.Remove(mark)
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			args := append(append([]string{}, c.cmd...), "--"+c.flag, c.val)
			code, out, errs := runCLI(t, args...)
			if code != exitUsage || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, "--"+c.flag+" ") || !strings.Contains(errs, c.want) {
				t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, one line naming --%s and %q", args, code, out, errs, c.flag, c.want)
			}
			if _, err := os.Stat(mark); err == nil {
				t.Fatalf("%q started questd before refusing", args)
			}
			if left, _ := os.ReadDir(tmp); len(left) > 0 {
				t.Errorf("%q left %s in TMPDIR", args, left[0].Name())
			}
			name := c.cmd[0]
			if len(c.cmd) > 1 && !strings.HasPrefix(c.cmd[1], "-") {
				name += " " + c.cmd[1]
			}
			if h := helpOf(t, strings.Fields(name), c.flag); !strings.Contains(h, c.help) {
				t.Errorf("--help of %s --%s gives no range %q: %q", name, c.flag, c.help, h)
			}
		})
	}
}

// sparseFile makes a file of size bytes holding no blocks on disk.
func sparseFile(t *testing.T, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "big")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Skipf("no sparse file here: %v", err)
	}
	return p
}

// TestFileReadsBounded: every user file questctl reads whole is refused
// from its size, past its documented limit, before any of it is read:
// exit 2 in one line naming the flag, the size and the limit, within a
// second, allocating under 8 MiB (a 396 MB replay case took 3 GB for 70 s
// before it was refused; a 300 MiB --prompts file took 1.4 GB before the
// decoder failed on it).
func TestFileReadsBounded(t *testing.T) {
	for _, c := range []struct {
		args []string // "FILE" is the large file
		size int64
		want string
	}{
		{[]string{"replay", "--in", "FILE", "--max-memory", "64MiB"}, 1 << 30, "--in FILE: 1.0 GiB, more than the 2.0 MiB (2097152 bytes) limit of this file (the limit: 1/32 of the 64.0 MiB memory limit"},
		{[]string{"generate", "--model", ".", "--prompt-file", "FILE"}, maxInputFile + 1, "--prompt-file: read FILE: 256.0 MiB, more than the 256.0 MiB (268435456 bytes) limit"},
		{[]string{"eval", "passkey", "--model", ".", "--prompts", "FILE"}, maxInputFile + 1, "--prompts: read FILE"},
		{[]string{"calibrate", "--model", ".", "--prompts", "FILE"}, maxInputFile + 1, "--prompts: read FILE"},
		{[]string{"plot", "--in", "FILE", "--out", "x.png"}, maxInputFile + 1, "--in FILE: 256.0 MiB, more than"},
		{[]string{"status", "--addr", "127.0.0.1:1", "--token-file", "FILE"}, maxTokenFile + 1, `--token-file "FILE": 64.0 KiB, more than the 64.0 KiB (65536 bytes) limit`},
		{[]string{"status", "--addr", "127.0.0.1:1", "--plaintext=false", "--ca", "FILE"}, 1<<20 + 1, `--ca "FILE": 1.0 MiB, more than the 1.0 MiB (1048576 bytes) limit`},
	} {
		t.Run(strings.Join(c.args[:2], " "), func(t *testing.T) {
			big := sparseFile(t, c.size)
			args := make([]string, len(c.args))
			for i, a := range c.args {
				args[i] = strings.ReplaceAll(a, "FILE", big)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			code, out, errs := runCLI(t, args...)
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			want := strings.ReplaceAll(c.want, "FILE", big)
			if code != exitUsage || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2, one line with %q", code, out, errs, want)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 || took > time.Second {
				t.Errorf("the refusal allocated %d bytes in %v: want under 8 MiB within a second (nothing read)", alloc, took)
			}
		})
	}
}
