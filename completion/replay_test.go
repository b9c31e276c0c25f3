package completion

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/model"
)

// getJSON gets url into v and returns the status.
func getJSON(t *testing.T, method, url string, v any) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp.StatusCode
}

// TestHistory: the server keeps the last History finished requests by
// completion id, newest first, with the prompt's and the output's
// tokens (greedy: each token is the logits' most likely) and the
// effective settings; older ones are forgotten (404 naming the id), a
// history of 0 keeps none, and wrong methods are 405.
func TestHistory(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.History = 2
	_, ts := startServer(t, m, tok, cfg)
	var ids []string
	for i, q := range []map[string]any{nil, {"budget": 32, "sink": 1}, {"selector": "dense"}} {
		r := map[string]any{"model": "tiny", "prompt": fmt.Sprintf("prompt number %d", i), "max_tokens": 3 + i, "temperature": 0}
		if q != nil {
			r["quest"] = q
		}
		ids = append(ids, complete(t, ts.URL, r).ID)
	}
	var list RecordList
	if code := getJSON(t, "GET", ts.URL+"/admin/requests", &list); code != 200 || len(list.Data) != 2 || list.Max != 2 ||
		list.Data[0].ID != ids[2] || list.Data[1].ID != ids[1] || list.Data[0].CompletionTokens != 5 {
		t.Fatalf("list: %d %+v", code, list)
	}
	var rec RequestRecord
	if code := getJSON(t, "GET", ts.URL+"/admin/requests/"+ids[1], &rec); code != 200 {
		t.Fatalf("record: %d", code)
	}
	s := rec.Settings
	if !slices.Equal(rec.PromptTokens, model.PromptIDs(tok, "prompt number 1")) || len(rec.OutputTokens) != 4 ||
		!slices.Equal(rec.QuestArgmax, rec.OutputTokens) || jsonText(tok.Decode(rec.OutputTokens)) != rec.Text ||
		rec.FinishReason != "length" || !s.Greedy || s.Budget != 32 || s.Sink != 1 || s.Local != 1 || s.Selector != "quest" || s.MaxTokens != 4 {
		t.Errorf("record %+v", rec)
	}
	if getJSON(t, "GET", ts.URL+"/admin/requests/"+ids[2], &rec); rec.Settings.Selector != "dense" {
		t.Errorf("dense record: %+v", rec.Settings)
	}
	var e ErrorBody
	if code := getJSON(t, "GET", ts.URL+"/admin/requests/"+ids[0], &e); code != 404 || e.Error.Param == nil || *e.Error.Param != "id" {
		t.Errorf("forgotten request: %d %+v", code, e)
	}
	if code := getJSON(t, "GET", ts.URL+"/admin/requests/"+ids[1]+"/replay", &e); code != 405 {
		t.Errorf("GET replay: %d", code)
	}
	if code := getJSON(t, "POST", ts.URL+"/admin/requests/"+ids[1]+"/other", &e); code != 404 {
		t.Errorf("unknown admin path: %d", code)
	}
	cfg.History = 0
	_, ts0 := startServer(t, m, tok, cfg)
	id := complete(t, ts0.URL, map[string]any{"model": "tiny", "prompt": "x", "max_tokens": 2}).ID
	if code := getJSON(t, "GET", ts0.URL+"/admin/requests/"+id, &e); code != 404 || !strings.Contains(e.Error.Message, "keeps no requests") {
		t.Errorf("history 0: %d %+v", code, e)
	}
}

// denseAlone generates greedily with dense attention (the float32
// kernel), the reference of a dense replay.
func denseAlone(t *testing.T, m *model.Model, tok model.Tokenizer, ids []int, maxTokens int) []int {
	t.Helper()
	out, err := m.Generate(context.Background(), model.NewDense(m.Geometry(), 0), ids, model.GenerateOptions{MaxTokens: maxTokens, StopTokens: model.StopIDs(tok, m.Config)})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReplayDense: a kept request replayed densely, teacher-forced on
// its tokens: with the dense selector every token agrees; with a
// one-page budget on every layer Quest goes wrong, and the replay's
// first divergence is where a dense generation of the same prompt
// leaves Quest's tokens, with the dense token it picks there.
func TestReplayDense(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	name := dir[strings.LastIndex(dir, "/")+1:]
	cfg := testConfig(name)
	cfg.CapacityPages = 1024
	_, ts := startServer(t, m, tok, cfg)
	p, err := eval.Passkey(rand.New(rand.NewPCG(3, 3)), 1500, eval.PasskeyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const maxTokens = 8
	ids := model.PromptIDs(tok, p.Text())
	want := denseAlone(t, m, tok, ids, maxTokens)
	for _, c := range []struct {
		name  string
		quest map[string]any
	}{{"dense", map[string]any{"selector": "dense"}}, {"one page", map[string]any{"budget": 16, "dense_layers": 0}}} {
		cmpl := complete(t, ts.URL, map[string]any{"model": name, "prompt": p.Text(), "max_tokens": maxTokens, "temperature": 0, "quest": c.quest})
		var rep ReplayReport
		if code := getJSON(t, "POST", ts.URL+"/admin/requests/"+cmpl.ID+"/replay", &rep); code != 200 {
			t.Fatalf("%s: replay %d %+v", c.name, code, rep)
		}
		var rec RequestRecord
		getJSON(t, "GET", ts.URL+"/admin/requests/"+cmpl.ID, &rec)
		if len(rep.Tokens) != len(rec.OutputTokens) || rep.PromptTokens != len(ids) {
			t.Fatalf("%s: %d tokens replayed of %d", c.name, len(rep.Tokens), len(rec.OutputTokens))
		}
		for i, tk := range rep.Tokens {
			if tk.Index != i || tk.Position != len(ids)+i || tk.Token != rec.OutputTokens[i] || tk.Quest != tk.Token || tk.Agree != (tk.Quest == tk.Dense) || tk.DenseLogprob > 0 {
				t.Errorf("%s: token %+v", c.name, tk)
			}
		}
		// Dense generation follows Quest's tokens up to the first
		// divergence, and there picks the replay's dense token.
		div := rep.FirstDivergence
		n := len(rec.OutputTokens)
		if div >= 0 {
			n = div
		}
		if !slices.Equal(want[:min(n, len(want))], rec.OutputTokens[:n]) || (div >= 0 && (div >= len(want) || want[div] != rep.Tokens[div].Dense)) {
			t.Errorf("%s: quest %v, divergence at %d (%+v); dense alone %v", c.name, rec.OutputTokens, div, rep, want)
		}
		t.Logf("%s: %q, answer %s; %d of %d agree, first divergence %d", c.name, cmpl.Choices[0].Text, p.Answer, rep.Agree, len(rep.Tokens), div)
		switch {
		case c.name == "dense" && (div != -1 || rep.Agree != len(rep.Tokens)):
			t.Errorf("dense selector: the replay disagrees at %d", div)
		case c.name == "one page" && div == -1:
			t.Errorf("a one-page budget agrees with dense on every token: the test shows nothing")
		}
	}
}
