package completion

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/model"
)

// TestITLBudgetFixedCost checks the per-chunk fixed cost's fit and its
// use against numbers worked by hand: chunks that cost exactly
// F + n*(a + s*x) (F 4ms, a 0.3ms, s 0.2us a token of context, x the
// chunk's mean context) of different token counts give back F, a and s;
// chunks that all have one token count do not change a fitted F; and a
// chunk runs only when its tokens take at least F.
func TestITLBudgetFixedCost(t *testing.T) {
	const f, a, s = 4e-3, 0.3e-3, 0.2e-6
	chunk := func(c, n int) time.Duration {
		x := float64(c) + float64(n-1)/2
		return time.Duration((f + float64(n)*(a+s*x)) * 1e9)
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Abs(want)+1e-12 {
			t.Errorf("%s = %.9g, want %.9g", what, got, want)
		}
	}
	b := newITLBudget(2)
	c := 0
	for _, n := range []int{512, 1, 512, 7, 2, 64, 1, 3} {
		b.observePrefill(c, n, chunk(c, n))
		c += n
	}
	near("fixed cost", b.fixedCost(), f)
	p, _ := b.perToken(0)
	near("per token at 0", p, a)
	p, _ = b.perToken(10000)
	near("per token at 10000", p, a+s*10000)
	near("cost of 10 tokens at 1000", b.cost(1000, 10), f+10*(a+s*1004.5))
	// 10ms at context 0: 6ms after F, 19 tokens (19 x (0.3 + 0.0018) =
	// 5.734ms; 20 x 0.3019 = 6.038ms does not fit).
	if got := b.tokens(0, 0.010); got != 19 {
		t.Errorf("tokens(0, 10ms) = %d, want 19", got)
	}
	// 6ms: 2ms after F fits 6 tokens (1.8ms), less than F: none (held).
	if got := b.tokens(0, 0.006); got != 0 {
		t.Errorf("tokens(0, 6ms) = %d, want 0: 6 tokens take 1.8ms, less than the 4ms fixed cost", got)
	}
	// 8.1ms: 4.1ms after F fits 13 tokens (3.916ms), less than F: none.
	if got := b.tokens(0, 0.0081); got != 0 {
		t.Errorf("tokens(0, 8.1ms) = %d, want 0", got)
	}
	// 8.5ms: 4.5ms after F fits 14 tokens (4.218ms), not less than F.
	if got := b.tokens(0, 0.0085); got != 14 {
		t.Errorf("tokens(0, 8.5ms) = %d, want 14", got)
	}
	// Chunks of one token count (1/n does not spread, once the others
	// decayed): F is not fitted from them, and the fitted one stays.
	for range 60 {
		b.observePrefill(0, 4, chunk(0, 4))
	}
	if _, ok := b.fitFixed(); ok {
		t.Error("F fitted from chunks of 4 tokens alone")
	}
	near("fixed cost after chunks of 4", b.fixedCost(), f)
	p, _ = b.perToken(1.5)
	near("per token after chunks of 4", p, a+s*1.5)

	// Costs with no fixed part: F is 0 and the budget is the line's.
	z := newITLBudget(2)
	for i, n := range []int{1, 100, 3, 50} {
		z.observePrefill(1000*i, n, time.Duration(float64(n)*(a+s*(float64(1000*i)+float64(n-1)/2))*1e9))
	}
	near("fixed cost of costs without one", z.fixedCost(), 0)
	p, _ = z.perToken(0)
	near("per token at 0 without a fixed cost", p, a)
}

// TestITLBudgetServerFixedCost: with MaxITLFactor 2 and made-up costs
// with a fixed part (a decode step 10ms; a prompt chunk 8ms plus 1ms a
// token), a 300-token prompt sent while four streams decode is prefilled
// beside them in chunks of 12 tokens, each after one iteration that held
// (its allowance, 10ms, fits 2 tokens after the fixed cost, whose 2ms
// are less than it: the next iteration's 20ms fits 12 tokens, 12ms),
// and its answer is the one it gets alone. Without the fixed cost in
// the budget every iteration would run a token or two at mostly 8ms.
func TestITLBudgetServerFixedCost(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	name := dir[strings.LastIndex(dir, "/")+1:]
	const (
		streams = 4
		fixed   = 8 * ms
		token   = 1 * ms
		decode  = 10 * ms
		long    = 300
	)
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
	var at []int // the iterations with prompt tokens
	total := 0
	for k := from + 1; k < len(iters); k++ {
		if iters[k].prompt > 0 {
			at = append(at, k)
			total += iters[k].prompt
		}
	}
	var chunks []itlIter
	for _, k := range at {
		chunks = append(chunks, iters[k])
	}
	t.Logf("chunks %v", chunks)
	if total != len(ids) || len(at) != (len(ids)+11)/12 {
		t.Fatalf("the %d-token prompt ran in %d iterations (%d tokens), want %d of 12 tokens", len(ids), len(at), total, (len(ids)+11)/12)
	}
	for i, k := range at {
		if it := iters[k]; it.rows != streams || it.prompt != min(12, len(ids)-12*i) {
			t.Errorf("chunk %d: %d prompt tokens beside %d decode rows, want %d beside %d", i, it.prompt, it.rows, min(12, len(ids)-12*i), streams)
		}
		if i > 0 && at[i]-at[i-1] != 2 {
			t.Errorf("chunk %d: %d iterations after the one before, want 2 (one held)", i, at[i]-at[i-1])
		}
	}
}
