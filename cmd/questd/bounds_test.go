package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker/remote"
)

// TestCreateBeyondMemory: with --max-memory none and a pool no machine
// holds (2^31-1 pages a rank, about 10 TiB here), a create is refused
// with RESOURCE_EXHAUSTED in one line that names what was asked and not
// the node's memory, instead of the Go runtime's out-of-memory crash
// (issue 28: the node died with a runtime stack). The node runs under a
// 1 GiB address-space margin (outside race builds); it then still
// creates a sequence of a small grid config, refuses a config whose sizes
// are past their bounds as INVALID_ARGUMENT, and its log names the bound
// that refused the pool.
func TestCreateBeyondMemory(t *testing.T) {
	args := append(slices.Clone(smallNode), "--capacity-pages", "2147483647", "--max-memory", "none", "--log-format", "json")
	p, err := spawnQuestdEnv(t, []string{addressSpaceEnv + "=" + "1073741824"}, args...)
	if err != nil {
		t.Fatal(err)
	}
	awaitReady(t, p)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, p.ready["grpc"], client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 2 {
		_, _, err := c.Create(ctx, plan.Striped)
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("create of a 2^31-1 page pool: %v, want RESOURCE_EXHAUSTED", err)
		}
		msg := status.Convert(err).Message()
		if strings.Contains(msg, "\n") || !strings.Contains(msg, "2147483647 pages") || !strings.Contains(msg, "memory can hold") || strings.Contains(msg, "swap") || strings.Contains(msg, "ulimit") {
			t.Fatalf("refusal %q: want one line naming the pool asked for and not the node's memory", msg)
		}
	}
	small, err := load(t, nil, smallNode...)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.CreateWith(ctx, plan.Striped, remote.GridConfigProto(small.engineConfig().WorkerConfig())); err != nil {
		t.Fatalf("a small grid after the refusals: %v", err)
	}
	// A request's sizes past their bounds are bad input, refused before
	// placement or any allocation.
	huge := remote.GridConfigProto(small.engineConfig().WorkerConfig())
	huge.Cp, huge.QHeads = 100000, 1000000000
	if _, _, err := c.CreateWith(ctx, plan.Striped, huge); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "want 1..") {
		t.Fatalf("create with cp 100000 and q heads 1e9: %v, want INVALID_ARGUMENT naming a range", err)
	}
	logged := p.logRecords("worker server: grid refused: memory")
	if len(logged) != 2 || !strings.Contains(logged[0]["err"].(string), "even with no memory limit") {
		t.Fatalf("log records of the refusals: %v", logged)
	}
}

// TestFlagBounds: every size, count and duration flag of questd has a
// range, given in --help and checked before anything starts: a value
// just past either end exits 2 with one line naming the flag and its
// range, within a deadline, and leaves no --data-dir behind (the filed
// cases: --cp 100000, --layers 1e9, --head-dim 1e9, --suspicion-mult 1e9
// were accepted; --monitor-queue 1e12 crashed at start).
func TestFlagBounds(t *testing.T) {
	var help bytes.Buffer
	if code := run(t.Context(), []string{"--help"}, envOf(nil), &help, &help); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	// flagHelp is the --help text of one flag: its line and the indented
	// lines under it, up to the next flag.
	flagHelp := func(name string) string {
		var b strings.Builder
		in := false
		for _, line := range strings.Split(help.String(), "\n") {
			switch {
			case strings.HasPrefix(line, "  --"+name+" ") || line == "  --"+name:
				in = true
			case strings.HasPrefix(line, "  --"):
				in = false
			}
			if in {
				b.WriteString(strings.TrimSpace(line) + " ")
			}
		}
		return b.String()
	}
	for _, c := range []struct {
		flag, value, want, help string
	}{
		{"cp", "100000", "want 1..4096", "1..4096"},
		{"layers", "1000000000", "want 1..1024", "1..1024"},
		{"head-dim", "1000000000", "want 1..1024", "1..1024"},
		{"suspicion-mult", "1000000000", "want 1..100", "1..100"},
		{"tp", "1025", "want 1..1024", "1..1024"},
		{"page-size", "65537", "want 1..65536", "1..65536"},
		{"capacity-pages", "2147483648", "more than 2147483647", "1..2147483647"},
		{"budget-tokens", "1073741825", "want 1..1073741824", "--page-size..1073741824"},
		{"dense-layers", "1025", "want 0..1024", "0..1024"},
		{"dense-layers", "-1", "want 0..1024", "0..1024"},
		{"dense-rho", "2.5", "want 0..2", "0..2"},
		{"dense-rho", "NaN", "want 0..2", "0..2"},
		{"reuse-steps", "-1", "want 0..4096", "0..4096"},
		{"reuse-steps", "4097", "want 0..4096", "0..4096"},
		{"max-pages", "1099511627777", "--capacity-pages..1099511627776", "--capacity-pages..1099511627776"},
		{"max-running", "65537", "want 1..65536", "1..65536"},
		{"max-running", "0", "want 1..65536", "1..65536"},
		{"max-queued", "1048577", "want 0..1048576", "0..1048576"},
		{"max-model-len", "1073741825", "want 0..1073741824", "0..1073741824"},
		{"prefill-chunk-tokens", "1048577", "want 1..1048576", "1..1048576"},
		{"max-batched-tokens", "4194305", "--max-running..4194304", "--max-running..4194304"},
		{"max-itl-factor", "101", "want 0 (off) or 1..100", "1..100"},
		{"max-itl-factor", "0.5", "want 0 (off) or 1..100", "1..100"},
		{"max-itl-factor", "-1", "want 0 (off) or 1..100", "1..100"},
		{"max-itl-factor", "NaN", "want 0 (off) or 1..100", "1..100"},
		{"serve-policy-grids", "65", "want 0..64", "0..64"},
		{"serve-grid-retries", "101", "want 0..100", "0..100"},
		{"monitor-queue", "1000000000000", "want 1..65536", "1..65536"},
		{"request-history", "65537", "want 0..65536", "0..65536"},
		{"serve-cp", "65", "want 1..64", "1..64"},
		{"serve-tp", "0", "want 1..64", "1..64"},
		{"max-request-bytes", "1073741825", "want 1..1073741824", "1..1073741824"},
		{"http-max-conns", "1048577", "want 1..1048576", "1 to 1048576"},
		{"sync-interval", "61m", "want at most 1h0m0s", "at most 1h"},
		{"step-timeout", "61m", "want at most 1h0m0s", "at most 1h"},
		{"probe-interval", "61s", "want at most 1m0s", "at most 1m"},
		{"gossip-interval", "61s", "want at most 1m0s", "at most 1m"},
		{"dead-node-reclaim", "61m", "want at most 1h0m0s", "at most 1h"},
		{"drain-timeout", "61m", "want at most 1h0m0s", "0..1h"},
		{"grid-idle-timeout", "169h", "want at most 168h0m0s", "0..168h"},
		{"request-timeout", "169h", "want at most 168h0m0s", "0..168h"},
		{"sse-keepalive", "61m", "want at most 1h0m0s", "100ms..1h"},
		{"log-stats-interval", "61m", "want at most 1h0m0s", "1s..1h"},
		{"serve-grid-retry-wait", "61m", "want at most 1h0m0s", "0..1h"},
		{"http-read-header-timeout", "61m", "want at most 1h0m0s", "at most 1h"},
		{"http-idle-timeout", "25h", "want at most 24h0m0s", "at most 24h"},
	} {
		t.Run(c.flag+"="+c.value, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			var out, errb bytes.Buffer
			args := []string{"--insecure", "--name", "b0", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--metrics-addr", "",
				"--data-dir", dir, "--" + c.flag, c.value}
			code := run(ctx, args, envOf(nil), &out, &errb)
			msg := errb.String()
			if code != 2 || out.Len() != 0 || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "--"+c.flag+" ") || !strings.Contains(msg, c.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 and one line naming --%s and %q", code, out.String(), msg, c.flag, c.want)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("--data-dir created before the refusal: %v", err)
			}
			if h := flagHelp(c.flag); h == "" || (c.help != "" && !strings.Contains(h, c.help)) {
				t.Errorf("--help of --%s gives no range %q: %q", c.flag, c.help, h)
			}
		})
	}
}

// TestFileReadsBounded: --config, --token-file and --gossip-key-file past
// their limits (1 MiB, 64 KiB, 64 KiB) are refused from their size at
// start, before any of the file is read: exit 2 in one line naming the
// flag, the size and the limit, allocating under 8 MiB within a second.
func TestFileReadsBounded(t *testing.T) {
	for _, c := range []struct {
		flag string
		size int64
		want string
	}{
		{"config", maxConfigFile + 1, "1.0 MiB, more than the 1.0 MiB (1048576 bytes) limit of this file"},
		{"token-file", maxSecretFile + 1, "64.0 KiB, more than the 64.0 KiB (65536 bytes) limit of this file"},
		{"gossip-key-file", 1 << 40, "1.0 TiB, more than the 64.0 KiB (65536 bytes) limit of this file"},
	} {
		t.Run(c.flag, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "big")
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(c.size); err != nil {
				t.Skipf("no sparse file here: %v", err)
			}
			f.Close()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			var out, errb bytes.Buffer
			code := run(t.Context(), []string{"--insecure", "--name", "b0", "--" + c.flag, p}, envOf(nil), &out, &errb)
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			msg := errb.String()
			if code != 2 || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "--"+c.flag+" ") || !strings.Contains(msg, c.want) {
				t.Errorf("exit %d, stderr %q; want exit 2, one line naming --%s and %q", code, msg, c.flag, c.want)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 || took > time.Second {
				t.Errorf("the refusal allocated %d bytes in %v: want under 8 MiB within a second (nothing read)", alloc, took)
			}
		})
	}
}
