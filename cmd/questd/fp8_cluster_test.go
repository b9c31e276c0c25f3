package main

import (
	"math"
	"strings"
	"testing"
)

// TestServeClusterFP8: questd --kv-cache-dtype fp8 --serve-layout
// cluster --serve-cp 2 on a 2-node cluster serves the greedy passkey
// completion over fp8 pages on both nodes (the grid config names the
// page type to the peer, a CPU node without --kv-cache-dtype): its
// tokens are those of --serve-layout local over fp8 pages, its
// log-probabilities within float rounding of the CP merge of them, and
// farther from the local f32 run's (the cluster's pages are fp8, not
// f32).
func TestServeClusterFP8(t *testing.T) {
	v1 := passkeyModel(t)
	ref := passkeyReference(t, v1)
	serve := []string{"--model", v1, "--http-addr", "127.0.0.1:0", "--budget-tokens", "256", "--prefill-chunk-tokens", "4096", "--prefix-caching=false"}
	complete := func(addr string) (string, []float64) {
		t.Helper()
		c := greedyLogprobs(t, addr, ref)
		return strings.Join(c.Logprobs.Tokens, "\x00"), c.Logprobs.TokenLogprobs
	}
	// local serves with --serve-layout local and the extra flags (none:
	// f32 CPU pages).
	local := func(extra ...string) (string, []float64) {
		t.Helper()
		cfg, err := load(t, nil, append(append(append([]string(nil), smallNode...), serve...), extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		ready, _, stop := runServe(t, cfg)
		toks, lps := complete(ready["http"])
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		return toks, lps
	}

	peer, err := load(t, nil, append(append([]string(nil), smallNode...), "--name", "m1")...)
	if err != nil {
		t.Fatal(err)
	}
	pready, _, pstop := runServe(t, peer)
	cfg, err := load(t, nil, append(append(append([]string(nil), smallNode...), serve...), "--join", pready["gossip"],
		"--kv-cache-dtype", "fp8", "--serve-layout", "cluster", "--serve-cp", "2", "--serve-capacity-pages", "256",
		// The prompt's one 4096-token chunk is loaded onto the peer
		// under the step deadline; the default 2s failed it under -race
		// on a loaded machine. The test is about fp8 pages, not timing.
		"--step-timeout", "1m")...)
	if err != nil {
		t.Fatal(err)
	}
	ready, _, stop := runServe(t, cfg)
	waitGauges(t, "two members up", func() bool { return gauge(t, ready["metrics"], "questrt_members_up") == 2 })
	toks, lps := complete(ready["http"])
	for _, addr := range []string{ready["metrics"], pready["metrics"]} {
		if g := gauge(t, addr, "questrt_grids", "role", "hosted"); g != 1 {
			t.Errorf("node at %s hosts %v grids, want the served grid's rank", addr, g)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := pstop(); err != nil {
		t.Fatal(err)
	}

	fp8Toks, fp8LP := local("--kv-cache-dtype", "fp8")
	_, f32LP := local()
	if toks != fp8Toks || len(lps) != len(ref.Greedy) || !strings.Contains(strings.ReplaceAll(toks, "\x00", ""), "48213") {
		t.Fatalf("cluster fp8 tokens %q, local fp8 %q (want the pass key in %d tokens)", toks, fp8Toks, len(ref.Greedy))
	}
	worst, apart := 0.0, 0.0
	for i := range lps {
		worst = max(worst, math.Abs(lps[i]-fp8LP[i]))
		apart = max(apart, math.Abs(lps[i]-f32LP[i]))
	}
	t.Logf("|cluster fp8 - local fp8| <= %.3g, |cluster fp8 - local f32| up to %.3g", worst, apart)
	if worst > 1e-4 {
		t.Errorf("cluster fp8 log-probabilities %v, local fp8 %v", lps, fp8LP)
	}
	if apart <= 10*worst {
		t.Errorf("cluster fp8 and local f32 differ by %.3g only: the cluster's pages may not be fp8", apart)
	}
}
