package completion

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/model"
)

// TestITLBudgetSplit checks split against numbers worked by hand:
// chunks that cost exactly F + n*a (a 2ms a token) and an allowance of
// 10ms. With F 8ms a whole chunk worth F fits itlMaxSpend allowances
// (30ms: 11 tokens, 22ms), so chunks stay whole (0); with F 15ms none
// does (30ms fits 7 tokens, 14ms, less than F), and the chunk whose
// layers spread over 6 iterations takes 6 x itlSpreadShare allowances,
// 120ms: 52 tokens (119ms); with F 45ms 37 (119ms); with F 71ms none
// of those is worth F (24 tokens, 48ms), and the chunk is the tokens
// that fit 120ms: 24; with F 125ms not one token does: 1.
func TestITLBudgetSplit(t *testing.T) {
	for _, c := range []struct {
		f    time.Duration
		want int
	}{{8 * ms, 0}, {15 * ms, 52}, {45 * ms, 37}, {71 * ms, 24}, {125 * ms, 1}} {
		b := newITLBudget(2)
		for _, n := range []int{1, 30, 2, 17, 5, 64} {
			b.observePrefill(0, n, c.f+time.Duration(n)*2*ms)
		}
		if got := b.split(1000, 0.010, 6); got != c.want {
			t.Errorf("F %v: split = %d, want %d", c.f, got, c.want)
		}
		if got := b.split(1000, 0.010, 1); got != 0 {
			t.Errorf("F %v, one layer: split = %d, want 0", c.f, got)
		}
	}
	// No fixed cost (the per-token budget): never split.
	b := newITLBudget(2)
	b.perTokenOnly = true
	for _, n := range []int{1, 30, 2, 17} {
		b.observePrefill(0, n, 15*ms+time.Duration(n)*2*ms)
	}
	if got := b.split(1000, 0.010, 6); got != 0 {
		t.Errorf("per-token budget: split = %d, want 0", got)
	}
}

// TestITLBudgetServerSplit: with MaxITLFactor 2 and made-up costs whose
// fixed part no whole chunk can pay within itlMaxSpend allowances (a
// decode step 10ms; a prompt chunk 15ms plus 2ms a token), a 300-token
// prompt sent while four streams decode is prefilled beside them in
// chunks of 52 tokens whose 6 layers run one every other iteration
// (119ms / 6 = 19.8ms, within two allowances: the iteration before
// holds), so every iteration decodes the streams, and its answer is the
// one it gets alone.
func TestITLBudgetServerSplit(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	name := dir[strings.LastIndex(dir, "/")+1:]
	const (
		streams = 4
		fixed   = 15 * ms
		token   = 2 * ms
		decode  = 10 * ms
		long    = 300
		chunk   = 52
	)
	layers := m.Config.Layers
	cfg := testConfig(name)
	cfg.CapacityPages = 4096
	cfg.MaxRunning = 8
	cfg.PrefixCaching = false
	cfg.MaxITLFactor = 2
	url, rec := itlServer(t, m, tok, cfg, func(_, n int) time.Duration { return fixed + time.Duration(n)*token }, decode)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	startStreams(t, ctx, &wg, url, name, streams, func(i int) string {
		return fmt.Sprintf("Stream %d. The grass is green. The sky is blue.", i)
	})
	from := rec.waitLast(func(it itlIter) bool { return it.rows == streams && it.prompt == 0 })
	if from < 0 {
		t.Fatal("no iteration decoded the four streams alone within a minute")
	}
	p, err := eval.Passkey(rand.New(rand.NewPCG(29, 2)), long, eval.PasskeyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ids := model.PromptIDs(tok, p.Text())
	got := complete(t, url, map[string]any{"model": name, "prompt": p.Text(), "max_tokens": 6, "temperature": 0})
	if want := tok.Decode(alone(t, m, tok, cfg.Policy, ids, 6)); got.Choices[0].Text != want {
		t.Errorf("the long prompt beside the streams: %q; alone %q", got.Choices[0].Text, want)
	}
	iters := rec.snapshot()
	var at []int // the iterations whose prompt tokens' chunk ended
	total := 0
	for k := from + 1; k < len(iters); k++ {
		if iters[k].prompt > 0 {
			at = append(at, k)
			total += iters[k].prompt
		}
	}
	want := (len(ids) + chunk - 1) / chunk
	if total != len(ids) || len(at) != want {
		t.Fatalf("the %d-token prompt ran in %d chunks (%d tokens), want %d of %d tokens: %v", len(ids), len(at), total, want, chunk, iters[from:])
	}
	for i, k := range at {
		if it := iters[k]; it.rows != streams || it.prompt != min(chunk, len(ids)-chunk*i) {
			t.Errorf("chunk %d: %d prompt tokens beside %d decode rows, want %d beside %d", i, it.prompt, it.rows, min(chunk, len(ids)-chunk*i), streams)
		}
		if i > 0 && i < len(at)-1 && at[i]-at[i-1] != 2*layers {
			t.Errorf("chunk %d: %d iterations after the one before, want %d (a layer every other iteration)", i, at[i]-at[i-1], 2*layers)
		}
	}
	for k := at[0]; k <= at[len(at)-1]; k++ {
		if iters[k].rows != streams {
			t.Errorf("iteration %d: %d decode rows, want %d", k, iters[k].rows, streams)
		}
	}
}
