package completion

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
)

// sampleLog collects the monitor's samples.
type sampleLog struct {
	mu sync.Mutex
	s  []MonitorSample
}

func (l *sampleLog) add(s MonitorSample) {
	l.mu.Lock()
	l.s = append(l.s, s)
	l.mu.Unlock()
}

func (l *sampleLog) all() []MonitorSample {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]MonitorSample(nil), l.s...)
}

// inlineDiag runs a request alone on an engine of pol with the engine's
// diagnostics and a dense comparison on every decode step (the monitor's
// numbers computed on the critical path) and returns its tokens and, by
// (position, layer), each step's per-query-head page recall, mass
// recall and output error.
func inlineDiag(t *testing.T, m *model.Model, tok model.Tokenizer, cfg Config, ids []int, maxTokens int) ([]int, map[[2]int]model.StepInfo) {
	t.Helper()
	pol := cfg.Policy
	pages := (len(ids) + maxTokens + pol.PageSize - 1) / pol.PageSize
	e, err := engine.New(engine.ModelConfig(m.Geometry(), pol, pages+2))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	attn, err := model.NewEngineAttention(e, m.Geometry())
	if err != nil {
		t.Fatal(err)
	}
	attn.Options = engine.StepOptions{Diagnostics: true, TopR: cfg.Monitor.TopR}
	attn.Compare = true
	steps := map[[2]int]model.StepInfo{}
	out, err := m.Generate(context.Background(), attn, ids, model.GenerateOptions{MaxTokens: maxTokens, StopTokens: model.StopIDs(tok, m.Config),
		OnToken: func(i, _ int) error {
			if i == 0 {
				return nil // sampled from the prefill
			}
			for _, st := range attn.Steps() {
				steps[[2]int{len(ids) + i - 1, st.Layer}] = st
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return out, steps
}

// TestMonitorMatchesDiagnostics: at rate 1 every (step, layer, KV head)
// of the sparse layers is replayed off the critical path; each sample's
// page recall, mass recall and output error are those the engine's
// diagnostics give inline for the same step, the request's tokens are
// those of a run without the monitor, and once the replays are done no
// fork is left.
func TestMonitorMatchesDiagnostics(t *testing.T) {
	m, tok := tinyModel(t)
	var log sampleLog
	cfg := testConfig("tiny")
	cfg.Policy.BudgetTokens = 32 // 2 pages of about 20
	cfg.Policy.DenseLayers = 1
	cfg.Monitor = MonitorConfig{Rate: 1, Queue: 256, TopR: 10, Observe: log.add}
	s, ts := startServer(t, m, tok, cfg)
	prompt := strings.Repeat("The grass is green and the sky is blue. ", 8)
	const maxTokens = 12
	c := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": maxTokens, "temperature": 0})
	ids := model.PromptIDs(tok, prompt)
	want := alone(t, m, tok, cfg.Policy, ids, maxTokens)
	if c.Choices[0].Text != jsonText(tok.Decode(want)) {
		t.Fatalf("with the monitor: %q; without: %q", c.Choices[0].Text, tok.Decode(want))
	}
	g := m.Geometry()
	sparse := g.Layers - cfg.Policy.DenseLayers
	steps := maxTokens - 1
	st := waitStats(t, s, "the replays", func(st Stats) bool {
		return st.MonitorReplayed+st.MonitorFailed == st.MonitorSampled && st.EngineSequences == st.PrefixCacheEntries
	})
	if st.MonitorSampled != uint64(steps*sparse*g.KVHeads) || st.MonitorReplayed != st.MonitorSampled {
		t.Fatalf("%d steps x %d sparse layers x %d KV heads: %+v", steps, sparse, g.KVHeads, st)
	}
	_, diag := inlineDiag(t, m, tok, cfg, ids, maxTokens)
	grp := g.Heads / g.KVHeads
	samples := log.all()
	var worst float64
	seen := map[[3]int]bool{}
	for _, sm := range samples {
		key := [3]int{sm.Position, sm.Layer, sm.KVHead}
		if seen[key] || sm.Request != c.ID || sm.Layer < cfg.Policy.DenseLayers {
			t.Fatalf("sample %+v: repeated, of another request or of a dense layer", sm)
		}
		seen[key] = true
		d, ok := diag[[2]int{sm.Position, sm.Layer}]
		if !ok {
			t.Fatalf("sample %+v: no inline step at that position", sm)
		}
		var rec, mass, oe float64
		for h := sm.KVHead * grp; h < (sm.KVHead+1)*grp; h++ {
			rec += d.HeadRecall[h] / float64(grp)
			mass += d.HeadMassRecall[h] / float64(grp)
			oe += d.RelL2[h] / float64(grp)
		}
		for _, v := range []float64{sm.PageRecall, sm.MassRecall} {
			if !(v >= 0 && v <= 1) {
				t.Fatalf("sample %+v: recall outside 0..1", sm)
			}
		}
		diff := max(math.Abs(sm.PageRecall-rec), math.Abs(sm.MassRecall-mass), math.Abs(sm.OutputError-oe))
		worst = max(worst, diff)
		if diff > 1e-4 || sm.PagesRead != d.Plan.Reads() || sm.PagesTotal != d.Plan.Pages {
			t.Errorf("sample %+v; inline: recall %.6f mass %.6f error %.6f, pages %d/%d", sm, rec, mass, oe, d.Plan.Reads(), d.Plan.Pages)
		}
	}
	if len(samples) != int(st.MonitorReplayed) {
		t.Fatalf("%d samples observed, %d replayed", len(samples), st.MonitorReplayed)
	}
	lossy := 0
	for _, sm := range samples {
		if sm.MassRecall < 1-1e-9 {
			lossy++
		}
	}
	t.Logf("%d samples; worst difference from the inline diagnostics %.2g; %d with mass recall below 1", len(samples), worst, lossy)
	if lossy == 0 {
		t.Errorf("no sample lost any attention mass at a 2-page budget: the monitor measures nothing")
	}
}

// jsonText is s as a JSON string carries it (invalid UTF-8 replaced).
func jsonText(s string) string {
	b, _ := json.Marshal(s)
	var out string
	json.Unmarshal(b, &out)
	return out
}

// TestMonitorDropsWhenFull: with the replay goroutine held and a queue
// of one, the samples of later steps are dropped and counted, the
// request is not slowed down by them, and nothing is left once the
// replay goes on.
func TestMonitorDropsWhenFull(t *testing.T) {
	m, tok := tinyModel(t)
	hold := make(chan struct{})
	var once sync.Once
	held := make(chan struct{})
	cfg := testConfig("tiny")
	cfg.Policy.DenseLayers = 0
	cfg.Monitor = MonitorConfig{Rate: 1, Queue: 1, Observe: func(MonitorSample) {
		once.Do(func() { close(held) })
		<-hold
	}}
	s, ts := startServer(t, m, tok, cfg)
	done := make(chan Completion, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": "hello there", "max_tokens": 40, "temperature": 0})
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
		var c Completion
		if err == nil {
			json.NewDecoder(resp.Body).Decode(&c)
			resp.Body.Close()
		}
		done <- c
	}()
	<-held
	var c Completion
	select {
	case c = <-done: // the request finishes while the replay is held
	case <-time.After(20 * time.Second):
		close(hold)
		t.Fatal("the request waited for the monitor")
	}
	st := s.Stats()
	g := m.Geometry()
	want := uint64((c.Usage.CompletionTokens - 1) * g.Layers * g.KVHeads)
	if st.MonitorSampled+st.MonitorDropped != want || st.MonitorDropped == 0 || st.MonitorSampled > uint64(2*g.Layers*g.KVHeads) {
		t.Errorf("held replay, queue 1: %d sampled, %d dropped of %d (layer, KV head) pairs", st.MonitorSampled, st.MonitorDropped, want)
	}
	close(hold)
	waitStats(t, s, "the replays", func(st Stats) bool {
		return st.MonitorReplayed+st.MonitorFailed == st.MonitorSampled && st.EngineSequences == st.PrefixCacheEntries && st.UsedPages == st.PrefixCachePages
	})
}

// TestMonitorConfig: rates outside 0..1 and an empty queue are refused.
func TestMonitorConfig(t *testing.T) {
	for _, mc := range []MonitorConfig{{Rate: -0.1, Queue: 1}, {Rate: 1.5, Queue: 1}, {Rate: math.NaN(), Queue: 1}, {Rate: 0.1}, {Rate: 0.1, Queue: 4, TopR: -1}} {
		c := testConfig("tiny")
		c.Monitor = mc
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "monitor") {
			t.Errorf("monitor %+v: %v", mc, err)
		}
	}
}

// BenchmarkMonitorOverhead measures the monitor's cost on the requests:
// four concurrent greedy streaming requests (2,000-byte passkey-style
// prompts, all prefilled in the first iteration, then 128 tokens each
// decoded in one batch) on passkey-llama-v1 (budget 512 tokens, 2 dense
// layers of 6) at monitor rates 0, 0.01 and 0.1. tpot_ms is the mean
// over requests of (last chunk - first chunk) / (tokens - 1): decode
// only; ms/token is the batch's wall time over its tokens.
func BenchmarkMonitorOverhead(b *testing.B) {
	m, tok, dir := passkeyModel(b)
	name := dir[strings.LastIndex(dir, "/")+1:]
	prompt := strings.Repeat("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ", 22)
	for _, rate := range []float64{0, 0.01, 0.1} {
		b.Run(fmt.Sprintf("rate=%g", rate), func(b *testing.B) {
			cfg := testConfig(name)
			cfg.CapacityPages = 2048
			cfg.ChunkTokens = 8192
			cfg.Policy.BudgetTokens = 512
			cfg.Monitor.Rate = rate
			s, ts := startServer(b, m, tok, cfg)
			body, _ := json.Marshal(map[string]any{"model": name, "prompt": prompt, "max_tokens": 128, "temperature": 0, "stream": true,
				"stream_options": map[string]any{"include_usage": true}})
			tokens, reqs := 0, 0
			var tpot time.Duration
			var total time.Duration
			for b.Loop() {
				start := time.Now()
				var wg sync.WaitGroup
				var mu sync.Mutex
				for range 4 {
					wg.Go(func() {
						resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(string(body)))
						if err != nil {
							b.Error(err)
							return
						}
						defer resp.Body.Close()
						var first, last time.Time
						n := 0
						sc := bufio.NewScanner(resp.Body)
						for sc.Scan() {
							d, ok := strings.CutPrefix(sc.Text(), "data: ")
							if !ok || d == "[DONE]" {
								continue
							}
							var c Completion
							if err := json.Unmarshal([]byte(d), &c); err != nil {
								b.Error(err)
								return
							}
							if c.Usage != nil {
								n = c.Usage.CompletionTokens
								continue
							}
							if first.IsZero() {
								first = time.Now()
							}
							last = time.Now()
						}
						mu.Lock()
						if n > 1 {
							tpot += last.Sub(first) / time.Duration(n-1)
						}
						tokens += n
						reqs++
						mu.Unlock()
					})
				}
				wg.Wait()
				total += time.Since(start)
			}
			st := s.Stats()
			b.ReportMetric(float64(total.Microseconds())/1e3/float64(tokens), "ms/token")
			b.ReportMetric(float64(tpot.Microseconds())/1e3/float64(reqs), "tpot_ms")
			b.ReportMetric(float64(st.MonitorSampled)/float64(b.N), "samples/op")
			b.ReportMetric(float64(st.MonitorDropped)/float64(b.N), "dropped/op")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// TestMonitorOwnEngine: requests on an engine of their own (oracle
// selector, a sink page) are monitored too; their engine closes once
// the request and the replays on it are done, and no replay fails.
func TestMonitorOwnEngine(t *testing.T) {
	m, tok := tinyModel(t)
	var log sampleLog
	cfg := testConfig("tiny")
	cfg.Policy.BudgetTokens = 32
	cfg.Policy.DenseLayers = 0
	cfg.Monitor = MonitorConfig{Rate: 0.5, Queue: 8, Observe: log.add}
	s, ts := startServer(t, m, tok, cfg)
	prompt := strings.Repeat("The grass is green and the sky is blue. ", 8)
	for _, q := range []map[string]any{{"selector": "oracle", "sink": 1}, {"selector": "recent"}, {"gqa": "per_head"}} {
		complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 10, "temperature": 0, "quest": q})
	}
	st := waitStats(t, s, "the replays and the own engines", func(st Stats) bool {
		return st.MonitorReplayed+st.MonitorFailed == st.MonitorSampled && st.OwnEnginesOpen == 0
	})
	if st.OwnEngines != 3 || st.MonitorFailed != 0 || st.MonitorReplayed == 0 || len(log.all()) != int(st.MonitorReplayed) {
		t.Errorf("stats %+v, %d samples", st, len(log.all()))
	}
	for _, sm := range log.all() {
		if !(sm.PageRecall >= 0 && sm.PageRecall <= 1 && sm.MassRecall >= 0 && sm.MassRecall <= 1 && sm.OutputError >= 0) {
			t.Errorf("sample %+v", sm)
		}
	}
}
