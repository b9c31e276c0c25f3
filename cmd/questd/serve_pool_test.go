package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/internal/memlimit"
)

// TestServePoolFromMemory: with the default --serve-capacity-pages 0
// the local layout's pool is sized from memory. With plenty available
// it holds --max-running requests of max_model_len (16 x 8192 pages of
// 4 tokens for passkey-llama-v1's 32768 positions), as /metrics reports;
// a --max-memory too small for one request of max_model_len stops the
// start with an error naming the flags to change.
func TestServePoolFromMemory(t *testing.T) {
	v1 := passkeyModel(t)
	// 16 x 8192 pages of 6 layers x 2 KV heads x (K and V of 4 x 32
	// floats + a 2 x 32 summary) + 8 bytes: 2.0 GB, at half the memory.
	const pageBytes = 6*2*(2*4*32*4+2*32*4) + 8
	if avail, err := memlimit.Available(); err != nil || avail < 2*16*8192*pageBytes+(1<<30) {
		t.Skipf("memory available %d (%v): too little for a pool of 16 max-length requests at half of it", avail, err)
	}
	cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0")...)
	if err != nil {
		t.Fatal(err)
	}
	ready, _, stop := runServe(t, cfg)
	mf := scrape(t, ready["metrics"])
	if got := metric(t, mf, "questrt_serve_pages", "state", "capacity").GetGauge().GetValue(); got != 16*8192 {
		t.Errorf("questrt_serve_pages{state=capacity} = %v, want 16 x 8192 (--max-running requests of 32768 tokens in pages of 4)", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// --max-memory 64MiB: half of it holds 32 MiB / 15368 B = 2183
	// pages, fewer than one request's 8192.
	cfg, err = load(t, nil, append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0", "--max-memory", "64MiB")...)
	if err != nil {
		t.Fatal(err)
	}
	err = serve(t.Context(), cfg, slog.New(slog.DiscardHandler), io.Discard, prometheus.NewRegistry(), nil)
	if err == nil {
		t.Fatal("serve started with a pool smaller than one max-length request")
	}
	for _, w := range []string{"--serve-capacity-pages", "--serve-memory-fraction", "--max-model-len", "32768 tokens needs 8192"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("start error %q does not say %q", err, w)
		}
	}
}

// TestServePoolDefaults: --serve-capacity-pages 0 reaches the serve
// package as 0 (sized from memory) with the local and device layouts,
// the device's with --gpu-memory-utilization (0.9 by default, vLLM's),
// and with cluster (sized from the nodes' free pages); a given pool is
// passed as given.
func TestServePoolDefaults(t *testing.T) {
	for _, c := range []struct {
		layout string
		args   []string
		pages  int
		frac   float64
	}{
		{"local", nil, 0, 0.9},
		{"device", nil, 0, 0.9},
		{"device", []string{"--gpu-memory-utilization", "0.75"}, 0, 0.75},
		{"device", []string{"--serve-capacity-pages", "300"}, 300, 0.9},
		{"cluster", nil, 0, 0.9},
		{"cluster", []string{"--serve-capacity-pages", "300"}, 300, 0.9},
	} {
		cfg, err := load(t, nil, append([]string{"--insecure"}, c.args...)...)
		if err != nil {
			t.Fatalf("%s %v: %v", c.layout, c.args, err)
		}
		cfg.Serve.Layout = c.layout
		if sc := cfg.serveConfig(nil); sc.CapacityPages != c.pages || sc.DeviceMemoryFraction != c.frac {
			t.Errorf("%s %v: %d pages, device fraction %v; want %d, %v", c.layout, c.args, sc.CapacityPages, sc.DeviceMemoryFraction, c.pages, c.frac)
		}
	}
}

// TestGrowReservationsFlag: --grow-reservations reaches the server's
// config, on by default; --grow-reservations=false turns it off.
func TestGrowReservationsFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{{nil, true}, {[]string{"--grow-reservations"}, true}, {[]string{"--grow-reservations=false"}, false}} {
		cfg, err := load(t, nil, append([]string{"--insecure"}, c.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.serveConfig(nil).GrowReservations; got != c.want {
			t.Errorf("%v: GrowReservations %v, want %v", c.args, got, c.want)
		}
	}
}

// TestDefaultMaxTokensFlag: --default-max-tokens reaches the server's
// config: 16 by default, -1 is the rest of the context
// (completion.RestOfContext).
func TestDefaultMaxTokensFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 16},
		{[]string{"--default-max-tokens", "-1"}, completion.RestOfContext},
		{[]string{"--default-max-tokens", "300", "--max-model-len", "300"}, 300},
	} {
		cfg, err := load(t, nil, append([]string{"--insecure"}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if sc := cfg.serveConfig(nil); sc.DefaultMaxTokens != c.want || sc.Validate() != nil {
			t.Errorf("%v: default max tokens %d (%v), want %d", c.args, sc.DefaultMaxTokens, sc.Validate(), c.want)
		}
	}
}
