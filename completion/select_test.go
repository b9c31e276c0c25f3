package completion

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// questPolicy is the serving policy pol with a request's quest object
// applied, as questctl generate would set it for a run alone.
func questPolicy(t *testing.T, pol plan.Policy, q map[string]any) plan.Policy {
	t.Helper()
	for k, v := range q {
		switch k {
		case "budget":
			pol.BudgetTokens = v.(int)
		case "dense_layers":
			pol.DenseLayers = v.(int)
		case "sink":
			pol.SinkPages = v.(int)
		case "local":
			pol.LocalPages = v.(int)
		case "selector":
			s, err := plan.ParseSelector(v.(string))
			if err != nil {
				t.Fatal(err)
			}
			pol.Selector = s
		case "gqa":
			g, err := plan.ParseGQAMode(v.(string))
			if err != nil {
				t.Fatal(err)
			}
			pol.GQA = g
		default:
			t.Fatalf("quest field %s", k)
		}
	}
	return pol
}

// TestPerRequestSelection: requests whose selector (oracle, recent), GQA
// mode, sink or local pages differ from the engine's get, greedy, the
// tokens of the same request run alone on an engine of those settings:
// first one at a time, then all at once next to requests on the main
// engine, in one decode batch. Every own engine is gone afterwards.
func TestPerRequestSelection(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	name := dir[strings.LastIndex(dir, "/")+1:]
	cfg := testConfig(name)
	cfg.Policy.BudgetTokens = 128 // 8 of a prompt's 60 to 120 pages
	cfg.ChunkTokens = 512
	cfg.MaxRunning = 8
	cfg.CapacityPages = 2048
	s, ts := startServer(t, m, tok, cfg)
	rng := rand.New(rand.NewPCG(16, 1))
	quests := []map[string]any{
		{"selector": "oracle"},
		{"selector": "recent", "sink": 2},
		{"sink": 2, "local": 3},
		{"gqa": "per_head"},
		{"selector": "oracle", "gqa": "per_head", "sink": 1, "local": 2, "budget": 96, "dense_layers": 1},
		nil,
		{"selector": "quest", "local": 1, "budget": 64}, // the engine's settings restated: the main engine
		{"selector": "recent", "local": 0, "sink": 0, "dense_layers": 0},
	}
	own := 0
	for _, q := range quests {
		p := questPolicy(t, cfg.Policy, q)
		if p.Selector != cfg.Policy.Selector || p.GQA != cfg.Policy.GQA || p.SinkPages != cfg.Policy.SinkPages || p.LocalPages != cfg.Policy.LocalPages {
			own++
		}
	}
	type req struct {
		body      string
		ids       []int
		maxTokens int
		want      []int
	}
	reqs := make([]req, len(quests))
	differ := 0
	for i, q := range quests {
		p, err := eval.Passkey(rng, 900+150*i, eval.PasskeyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r := map[string]any{"model": name, "prompt": p.Text(), "max_tokens": 12 + i, "temperature": 0}
		if q != nil {
			r["quest"] = q
		}
		b, _ := json.Marshal(r)
		ids := model.PromptIDs(tok, p.Text())
		want := alone(t, m, tok, questPolicy(t, cfg.Policy, q), ids, 12+i)
		reqs[i] = req{string(b), ids, 12 + i, want}
		// The same prompt under the default settings, to see that the
		// options matter.
		if !slices.Equal(want, alone(t, m, tok, cfg.Policy, ids, 12+i)) {
			differ++
		}
	}
	check := func(phase string, i int, c Completion) {
		t.Helper()
		r := reqs[i]
		wantFinish := "length"
		if slices.Contains(model.StopIDs(tok, m.Config), r.want[len(r.want)-1]) {
			wantFinish = "stop"
		}
		if got := c.Choices[0]; got.Text != tok.Decode(r.want) || *got.FinishReason != wantFinish || c.Usage.CompletionTokens != len(r.want) {
			t.Errorf("%s: request %d (quest %v): %q %s, %d tokens; alone %q %s, %d tokens", phase, i, quests[i],
				got.Text, *got.FinishReason, c.Usage.CompletionTokens, tok.Decode(r.want), wantFinish, len(r.want))
		}
	}
	for i, r := range reqs {
		status, _, body := post(t, ts.URL+"/v1/completions", r.body)
		if status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, status, body)
		}
		var c Completion
		if err := json.Unmarshal(body, &c); err != nil {
			t.Fatal(err)
		}
		check("alone", i, c)
	}
	if st := s.Stats(); st.OwnEngines != uint64(own) {
		t.Errorf("%d requests ran on an own engine, want %d", st.OwnEngines, own)
	}
	// All at once: one decode batch mixes the main engine's sequences
	// and the own engines'.
	before := s.Stats()
	results := make([]Completion, len(reqs))
	errs := make([]string, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() {
			resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(r.body))
			if err != nil {
				errs[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs[i] = resp.Status
				return
			}
			if err := json.NewDecoder(resp.Body).Decode(&results[i]); err != nil {
				errs[i] = err.Error()
			}
		})
	}
	wg.Wait()
	for i := range reqs {
		if errs[i] != "" {
			t.Fatalf("request %d: %s", i, errs[i])
		}
		check("together", i, results[i])
	}
	after := s.Stats()
	if steps, seqs := after.Steps-before.Steps, after.StepSequences-before.StepSequences; seqs <= steps {
		t.Errorf("no decode step ran more than one sequence (%d steps, %d sequences)", steps, seqs)
	}
	t.Logf("%d of %d requests' settings change their tokens against the defaults; %d own engines", differ, len(quests), after.OwnEngines)
	if differ == 0 {
		t.Errorf("no request's settings changed its tokens: the test would not see them ignored")
	}
	unchanged(t, s, uint64(2*len(reqs)))
	if st := s.Stats(); st.OwnEnginesOpen != 0 {
		t.Errorf("%d own engines left open", st.OwnEnginesOpen)
	}
}
