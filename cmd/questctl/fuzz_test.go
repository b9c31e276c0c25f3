package main

import (
	"context"
	"io"
	"runtime"
	"strings"
	"testing"
)

// fuzzLimit is the --max-memory every fuzzed command runs under.
const fuzzLimit = 64 << 20

// FuzzCLI feeds arbitrary argument lists to every subcommand: none may
// panic, exit with anything but 0, 1 or 2, or allocate much beyond the
// --max-memory preflight (the fuzzed flags come first, so the appended
// limit wins). Commands run under a cancelled context, so a valid
// configuration stops at its first cancellation check instead of running a
// benchmark; what is exercised is parsing, validation and preflight.
//
//	go test -run '^$' -fuzz FuzzCLI -fuzztime 60s ./cmd/questctl/
func FuzzCLI(f *testing.F) {
	for _, seed := range []string{
		"demo --context 0",
		"demo --context 10000000",
		"demo --dense-layers 5 --layers 4",
		"demo --page-size 1000000",
		"demo --budget 1000000000",
		"demo --head-dim -1 --kv-heads 0",
		"replay --in ../../examples/replay/case.json --cp 10000",
		"bench\x00attention --context 100000000",
		"bench\x00selection --kv-heads 0 --page-size 0 --head-dim -1",
		"bench\x00collective --steps 0 --k 0",
		"bench\x00collective --shards 100000",
		"devices --json",
		"demo --context 4096 --budget 256 --head-dim 16 --kv-heads 2 --q-heads 4",
		"replay gen --tokens 64",
		"replay --in ../../examples/replay/case.json --cp 3 --tp 2",
		"bench\x00attention --context 4096 --budget 256 --iters 1",
		"bench\x00selection --context 4096 --budget 256 --steps 1",
		"bench\x00collective --shards 2 --steps 3",
		"demo --selection  --gqa ",
		"bench\x00selection --selection exact,,union",
		"replay -in=- --cp 2",
		"demo --kv-cache-dtype f16 --dtype fp8",
		"bench\x00attention --dtype bf16 --backend cuda",
		"replay --in ../../examples/replay/case.json --tensor-parallel-size 2 --decode-context-parallel-size 3",
		"replay --in ../../examples/replay/case.json --backend cuda",
		"completion zsh",
		"completion\x00fish --help",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		cmd, rest, _ := strings.Cut(line, " ")
		var args []string
		if rest != "" {
			args = strings.Split(rest, " ") // empty arguments too ("a  b")
		}
		if strings.Contains(cmd, "\x00") { // "bench\x00attention": a two-word command
			a, b, _ := strings.Cut(cmd, "\x00")
			cmd, args = a, append([]string{b}, args...)
		}
		switch cmd {
		case "demo", "replay", "bench", "devices", "completion":
		default:
			return
		}
		for _, a := range args {
			// No writes outside the test, and no reads of the test's stdin
			// or of devices.
			if strings.Contains(a, "out") || strings.Contains(a, "/dev") || strings.HasSuffix(a, "=-") || a == "-" {
				return
			}
		}
		if cmd != "devices" && cmd != "completion" && !(cmd == "bench" && len(args) == 0) {
			args = append(args, "--max-memory", "64MiB")
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		code := run(ctx, append([]string{cmd}, args...), io.Discard, io.Discard)
		runtime.ReadMemStats(&after)
		if code < 0 || code > 2 {
			t.Fatalf("%q: exit %d", line, code)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 4*fuzzLimit {
			t.Fatalf("%q: allocated %d MiB under a %d MiB limit", line, grew>>20, fuzzLimit>>20)
		}
	})
}
