package completion

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/model"
)

const ms = time.Millisecond

// TestITLBudgetArithmetic checks the budget's costs and token counts
// against numbers worked by hand.
func TestITLBudgetArithmetic(t *testing.T) {
	near := func(t *testing.T, what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %.12g, want %.12g", what, got, want)
		}
	}
	t.Run("nothing measured", func(t *testing.T) {
		b := newITLBudget(2)
		if _, ok := b.allowance(); ok {
			t.Error("an allowance before any decode step")
		}
		// A probe: one token, whatever the time.
		if got := b.tokens(5000, 1); got != 1 {
			t.Errorf("tokens with no observation = %d, want 1", got)
		}
	})
	t.Run("decode average", func(t *testing.T) {
		b := newITLBudget(3)
		b.observeDecode(10 * ms) // the first step is the average
		a, _ := b.allowance()
		near(t, "allowance after 10ms", a, 0.020) // (3-1) x 10ms
		b.observeDecode(20 * ms)                  // 10 + 0.2 x (20 - 10) = 12
		a, _ = b.allowance()
		near(t, "allowance after 10ms, 20ms", a, 0.024)
		b.observeDecode(0) // not a measurement
		a, _ = b.allowance()
		near(t, "allowance after a zero step", a, 0.024)
	})
	t.Run("a line through two chunks", func(t *testing.T) {
		// 1 token at context 0 in 1ms, 1 at context 1000 in 3ms: the
		// line 1ms + 2us x context, whatever the weights.
		b := newITLBudget(3)
		b.observePrefill(0, 1, 1*ms)
		b.observePrefill(1000, 1, 3*ms)
		p, _ := b.perToken(2000)
		near(t, "per token at 2000", p, 0.005)
		// 3 tokens from context 2000: 5 + 5.002 + 5.004 ms.
		near(t, "3 tokens at 2000", b.cost(2000, 3), 0.015006)
		// Within 20ms from context 2000: 3 (15.006ms); 4 would be
		// 4 x 5.003 = 20.012ms.
		if got := b.tokens(2000, 0.020); got != 3 {
			t.Errorf("tokens(2000, 20ms) = %d, want 3", got)
		}
		// From context 0: 19 x (1 + 0.001 x 18) = 19.342ms fits,
		// 20 x 1.019 = 20.38ms does not.
		if got := b.tokens(0, 0.020); got != 19 {
			t.Errorf("tokens(0, 20ms) = %d, want 19", got)
		}
		if got := b.tokens(0, 0); got != 0 {
			t.Errorf("tokens with no time = %d, want 0", got)
		}
	})
	t.Run("a chunk is its tokens' mean context", func(t *testing.T) {
		// Chunks of 100 tokens at contexts 0 and 1000 on the line
		// 1ms + 2us x context: 100 x (1 + 0.002 x 49.5) = 109.9ms and
		// 100 x (1 + 0.002 x 1049.5) = 309.9ms.
		b := newITLBudget(2)
		b.observePrefill(0, 100, 109900*time.Microsecond)
		b.observePrefill(1000, 100, 309900*time.Microsecond)
		p, _ := b.perToken(0)
		near(t, "per token at 0", p, 0.001)
		p, _ = b.perToken(4000)
		near(t, "per token at 4000", p, 0.009)
	})
	t.Run("cost falling with context", func(t *testing.T) {
		// 3ms at 0 then 1ms at 1000: no negative slope; the weighted
		// mean (0.9 x 3 + 1) / 1.9 = 1.947368ms at every context.
		b := newITLBudget(2)
		b.observePrefill(0, 1, 3*ms)
		b.observePrefill(1000, 1, 1*ms)
		for _, c := range []float64{0, 500, 10000} {
			p, _ := b.perToken(c)
			near(t, fmt.Sprintf("per token at %v", c), p, 0.0037/1.9)
		}
		// 10ms / 1.947368ms = 5.135: 5 tokens.
		if got := b.tokens(500, 0.010); got != 5 {
			t.Errorf("tokens(500, 10ms) = %d, want 5", got)
		}
	})
	t.Run("one context", func(t *testing.T) {
		// Two chunks at context 100 (no slope to fit): their weighted
		// mean, (0.9 x 2 + 4) / 1.9 = 3.052632ms.
		b := newITLBudget(2)
		b.observePrefill(100, 1, 2*ms)
		b.observePrefill(100, 1, 4*ms)
		p, _ := b.perToken(5000)
		near(t, "per token", p, 0.0058/1.9)
		if got := b.tokens(5000, 0.0305); got != 9 { // 9.99: 9 tokens
			t.Errorf("tokens(5000, 30.5ms) = %d, want 9", got)
		}
	})
	t.Run("floor below the fitted contexts", func(t *testing.T) {
		// 1ms at 1000 and 3ms at 2000: the line -1ms + 2us x context,
		// below 0 at context 0, where the floor 5% of the mean cost,
		// 0.05 x (0.9 x 1 + 3) / 1.9 = 0.102632ms, holds.
		b := newITLBudget(2)
		b.observePrefill(1000, 1, 1*ms)
		b.observePrefill(2000, 1, 3*ms)
		p, _ := b.perToken(0)
		near(t, "per token at 0", p, 0.05*0.0039/1.9)
		// 9 x (0.102632 + 0.001 x 8) = 0.9957ms fits 1ms; 10 x
		// (0.102632 + 0.009) = 1.1163ms does not.
		if got := b.tokens(0, 0.001); got != 9 {
			t.Errorf("tokens(0, 1ms) = %d, want 9", got)
		}
	})
}

// TestITLBudgetServer: with MaxITLFactor 2 and made-up costs (a decode
// step 10ms, a prompt token 1.1ms + 13us x its context), a 300-token
// prompt sent while four streams decode is prefilled in iterations of
// exactly the tokens that fit 10ms by those costs (8 at first, one at
// the end, never none), every one beside the streams' decode rows, and
// its answer is the one it gets alone.
func TestITLBudgetServer(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	name := dir[strings.LastIndex(dir, "/")+1:]
	const (
		streams = 4
		a       = 1.1e-3 // s per prompt token
		slope   = 13e-6  // s per prompt token per token of context
		decode  = 10 * ms
		long    = 300
	)
	cfg := testConfig(name)
	cfg.CapacityPages = 4096
	cfg.MaxRunning = 8
	cfg.PrefixCaching = false
	cfg.MaxITLFactor = 2
	url, rec := itlServer(t, m, tok, cfg, func(c, n int) time.Duration {
		x := float64(c) + float64(n-1)/2
		return time.Duration(float64(n) * (a + slope*x) * float64(time.Second))
	}, decode)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	startStreams(t, ctx, &wg, url, name, streams, func(i int) string {
		return fmt.Sprintf("Stream %d. The grass is green. The sky is blue.", i)
	})
	// A stream's first token reaches its client before the iteration
	// that sampled it is recorded: wait for an iteration of the four
	// streams' decode rows alone (their prompts all prefilled).
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

	// The expected chunks, by the made-up costs: the most tokens n
	// (at least 1) with n x (a + slope x (c + (n-1)/2)) <= 10ms.
	var want []int
	for c := 0; c < len(ids); {
		n := 1
		for n+1 <= len(ids)-c && float64(n+1)*(a+slope*(float64(c)+float64(n)/2)) <= decode.Seconds() {
			n++
		}
		want = append(want, n)
		c += n
	}
	var prompt []itlIter
	for _, it := range rec.snapshot()[from:] {
		if it.prompt > 0 {
			prompt = append(prompt, it)
		}
	}
	if len(prompt) != len(want) {
		t.Errorf("the %d-token prompt took %d iterations, want %d", len(ids), len(prompt), len(want))
	}
	for k := range min(len(prompt), len(want)) {
		if prompt[k].prompt != want[k] || prompt[k].rows != streams {
			t.Errorf("iteration %d of the prompt: %d prompt tokens beside %d decode rows, want %d beside %d",
				k, prompt[k].prompt, prompt[k].rows, want[k], streams)
		}
	}
	t.Logf("%d prompt tokens in %d iterations beside the streams, first %v, last %v", len(ids), len(prompt), want[:3], want[len(want)-3:])
}

// itlIter is one scheduler iteration: its decode rows and prompt tokens.
type itlIter struct{ rows, prompt int }

// itlRecorder records a server's iterations (its hooks.batched).
type itlRecorder struct {
	mu    sync.Mutex
	iters []itlIter
}

func (r *itlRecorder) batched(rows, prompt int) {
	r.mu.Lock()
	r.iters = append(r.iters, itlIter{rows, prompt})
	r.mu.Unlock()
}

// snapshot returns the iterations recorded so far.
func (r *itlRecorder) snapshot() []itlIter {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.iters)
}

// waitLast returns the index of the last recorded iteration ok takes,
// polling for up to a minute until there is one; -1 if none came.
func (r *itlRecorder) waitLast(ok func(itlIter) bool) int {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * ms) {
		iters := r.snapshot()
		for k := len(iters) - 1; k >= 0; k-- {
			if ok(iters[k]) {
				return k
			}
		}
	}
	return -1
}

// itlServer starts a server of cfg whose prompt chunks and decode steps
// take the made-up times prefillTook and decode, with its iterations
// recorded; it closes with the test.
func itlServer(t *testing.T, m *model.Model, tok model.Tokenizer, cfg Config, prefillTook func(c, n int) time.Duration, decode time.Duration) (string, *itlRecorder) {
	t.Helper()
	rec := &itlRecorder{}
	s, err := newServer(m, tok, cfg, hooks{
		batched:     rec.batched,
		prefillTook: prefillTook,
		decodeTook:  func(int) time.Duration { return decode },
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	return ts.URL, rec
}

// startStreams starts k greedy streams of 3000 tokens (prompt(i) the
// i-th's) and returns once each has its first token: one stream first,
// the others once it decodes, so that their prompts are prefilled
// beside its decode rows, at several contexts, and the latency budget's
// fitted line has a spread to take its slope from (four prompts
// prefilled together at context 0 give one point, a slope of 0). The
// streams end with ctx; wg waits for their readers.
func startStreams(t *testing.T, ctx context.Context, wg *sync.WaitGroup, url, name string, k int, prompt func(int) string) {
	t.Helper()
	started := make(chan error, k)
	launch := func(i int) {
		body, _ := json.Marshal(map[string]any{"model": name, "prompt": prompt(i), "max_tokens": 3000, "temperature": 0, "stream": true})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				started <- err
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			first := true
			for sc.Scan() {
				if first && strings.HasPrefix(sc.Text(), "data: {") {
					first = false
					started <- nil
				}
			}
			if first {
				started <- fmt.Errorf("stream %d: no token (status %s)", i, resp.Status)
			}
		}()
	}
	launch(0)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	for i := 1; i < k; i++ {
		launch(i)
	}
	for i := 1; i < k; i++ {
		if err := <-started; err != nil {
			t.Fatal(err)
		}
	}
}

// TestITLBudgetHolds: with MaxITLFactor 2 and made-up costs (a decode
// step 10ms, so an iteration's allowance is 10ms; every prompt token
// the same cost at any context), a prompt token dearer than the
// allowance waits for the credit of the iterations that prefilled
// nothing: at 25ms a token, two iterations hold (credit 10, then 20ms)
// and the third prefills it (30ms left, 25 spent; two tokens would be
// 50ms), so the long prompt goes one token every third iteration; at
// 1s a token, 16 iterations hold (credit 160ms, short of it) and the
// 17th prefills it anyway (the progress guarantee; beside one stream,
// whose prompt is prefilled alone, so that no other prompt waits 17
// iterations a token). Every iteration decodes the streams, and the
// prompt's answer is the one it gets alone.
func TestITLBudgetHolds(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	name := dir[strings.LastIndex(dir, "/")+1:]
	const decode = 10 * ms
	for _, c := range []struct {
		token   time.Duration // a prompt token's made-up prefill time
		held    int           // the iterations with no prompt token before each with one
		streams int
	}{
		{25 * ms, 2, 4},
		{time.Second, itlMaxHeld, 1},
	} {
		streams := c.streams
		t.Run(fmt.Sprint(c.token), func(t *testing.T) {
			cfg := testConfig(name)
			cfg.CapacityPages = 4096
			cfg.MaxRunning = 8
			cfg.PrefixCaching = false
			cfg.MaxITLFactor = 2
			url, rec := itlServer(t, m, tok, cfg, func(_, n int) time.Duration { return time.Duration(n) * c.token }, decode)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			// The streams that prefill beside the first hold too.
			startStreams(t, ctx, &wg, url, name, streams, func(i int) string {
				return fmt.Sprintf("Stream %d. The grass is green. The sky is blue.", i)
			})
			// Past the streams' prompts: an iteration of every
			// stream's row, which needs them all prefilled.
			from := rec.waitLast(func(it itlIter) bool { return it.rows == streams })
			if from < 0 {
				t.Fatal("no iteration decoded the four streams within a minute")
			}
			const prompt = "The grass is green."
			ids := model.PromptIDs(tok, prompt)
			got := complete(t, url, map[string]any{"model": name, "prompt": prompt, "max_tokens": 6, "temperature": 0})
			if want := tok.Decode(alone(t, m, tok, cfg.Policy, ids, 6)); got.Choices[0].Text != want {
				t.Errorf("the prompt beside the streams: %q; alone %q", got.Choices[0].Text, want)
			}
			iters := rec.snapshot()
			// From the prompt's first token to its last, every iteration
			// decodes the streams, and holds or prefills one token.
			var at []int // the iterations with a prompt token
			for k := from + 1; k < len(iters); k++ {
				if iters[k].prompt > 0 {
					at = append(at, k)
				}
			}
			if len(at) != len(ids) {
				t.Fatalf("the %d-token prompt ran in %d iterations, want one a token: %v", len(ids), len(at), iters[from:])
			}
			for k := at[0]; k <= at[len(at)-1]; k++ {
				if it := iters[k]; it.rows != streams || it.prompt > 1 {
					t.Errorf("iteration %d: %d prompt tokens beside %d decode rows, want at most 1 beside %d", k, it.prompt, it.rows, streams)
				}
			}
			for i := 1; i < len(at); i++ {
				if h := at[i] - at[i-1] - 1; h != c.held {
					t.Errorf("token %d of the prompt: %d iterations held before it, want %d", i, h, c.held)
				}
			}
		})
	}
}

// TestITLBudgetCredit checks the credit of held iterations by hand.
func TestITLBudgetCredit(t *testing.T) {
	b := newITLBudget(2)
	b.observeDecode(10 * ms)
	b.observePrefill(0, 1, 25*ms) // 25ms a token at any context
	a, _ := b.allowance()
	// 10ms: no token fits; held twice, the credit is 20ms, and 30ms fit
	// one token (two would be 50ms).
	for i, want := range []int{0, 0, 1} {
		if got := b.tokens(8000, a+b.credit); got != want {
			t.Fatalf("iteration %d: %d tokens in %.0fms, want %d", i, got, 1e3*(a+b.credit), want)
		}
		if want == 0 {
			b.hold(a)
		}
	}
	if b.held != 2 || math.Abs(b.credit-0.020) > 1e-12 {
		t.Errorf("after two holds: held %d, credit %v, want 2 and 20ms", b.held, b.credit)
	}
	b.ran()
	if b.held != 0 || b.credit != 0 {
		t.Errorf("after a run: held %d, credit %v, want 0 and 0", b.held, b.credit)
	}
	for i := range itlMaxHeld {
		if b.mustRun() {
			t.Fatalf("must run after %d holds, want after %d", i, itlMaxHeld)
		}
		b.hold(a)
	}
	if !b.mustRun() {
		t.Errorf("no run forced after %d holds", itlMaxHeld)
	}
}

// TestITLBudgetTinySlope: a line fitted to costs flat in the context
// whose slope is rounding's (1e-20 s per token of context here) fits
// the tokens that the flat cost does: 80ms of 25ms tokens is 3, not 0
// (the quadratic's textbook root cancels to 0).
func TestITLBudgetTinySlope(t *testing.T) {
	b := newITLBudget(2)
	b.w, b.sx, b.sy = 1, 0, 0.025
	b.sxx, b.sxy = 1, 1e-20 // variance 1, slope 1e-20
	if _, _, slope, _ := b.line(); slope != 1e-20 {
		t.Fatalf("slope %v, want 1e-20", slope)
	}
	if got := b.tokens(0, 0.080); got != 3 {
		t.Errorf("tokens(0, 80ms) = %d, want 3", got)
	}
}
