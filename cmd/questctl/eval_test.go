package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/questrt/questrt/eval"
)

func evalCmd(ctx context.Context, args []string, out, errb *bytes.Buffer) error {
	return runEval(ctx, args, out, errb)
}

func TestEvalPasskey(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	code, out, errs := call(evalCmd, "passkey", "--model", v1, "--lengths", "512,1024", "--n", "2", "--budgets", "32,4096", "--selectors", "quest,recent", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// Per length: dense, then quest and recent at two budgets.
	if len(lines) != 2*5 {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	var recs []eval.Record
	for _, l := range lines {
		var r eval.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if r := recs[0]; r.Length != 512 || r.Selector != "dense" || r.Budget != 0 || r.N != 2 || r.TeacherForced != nil {
		t.Errorf("first line %+v", r)
	}
	if r := recs[2]; r.Selector != "quest" || r.Budget != 4096 || r.Accuracy != r.DenseAccuracy || *r.TeacherForced.TokenAgreement != 1 {
		t.Errorf("quest at full budget %+v", r)
	}
	if r := recs[3]; r.Selector != "recent" || r.Budget != 32 || r.TeacherForced.PagesFraction >= 1 || len(r.TeacherForced.Layers) != 6 || r.TeacherForced.Layers[5].MassRecall == nil {
		t.Errorf("recent at 32 %+v", r)
	}
	if !strings.Contains(errs, "length 1024 prompt 2/2") {
		t.Errorf("progress on stderr:\n%s", errs)
	}
	// A prompts file, and the table.
	pf := filepath.Join(t.TempDir(), "p.jsonl")
	line, _ := json.Marshal(eval.PromptLine{Prompt: refPrompt, Answer: "48213", Length: 7})
	if err := os.WriteFile(pf, append(line, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs = call(evalCmd, "passkey", "--model", v1, "--prompts", pf, "--budgets", "64", "--decode-question")
	if code != 0 || !strings.Contains(out, "length") || !strings.Contains(out, "quest") || !strings.Contains(out, "\n7 ") {
		t.Fatalf("exit %d, stdout %q, stderr %s", code, out, errs)
	}
}

// TestEvalHierGroup: --hier-group gives the same answers and the same
// teacher-forced distributions as flat scoring (the search is exact), and
// its JSON counts one ranked row per (step, sparse layer, KV head).
func TestEvalHierGroup(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	run := func(extra ...string) []eval.Record {
		t.Helper()
		args := append([]string{"passkey", "--model", v1, "--lengths", "1024", "--n", "2", "--budgets", "32,64", "--no-diagnostics", "--json"}, extra...)
		code, out, errs := call(evalCmd, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", extra, code, errs)
		}
		var recs []eval.Record
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var r eval.Record
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		if len(recs) != 3 {
			t.Fatalf("%v: %d lines", extra, len(recs))
		}
		return recs
	}
	flat, hier := run(), run("--hier-group", "2")
	const kvHeads, layers = 2, 6 // the v1 model
	for i := range flat {
		f, h := flat[i], hier[i]
		if f.Correct != h.Correct || f.Budget != h.Budget {
			t.Errorf("line %d: flat %d correct at %d, hier %d at %d", i, f.Correct, f.Budget, h.Correct, h.Budget)
		}
		if f.FreeRunning.Hier != nil {
			t.Errorf("line %d: flat run reports a search: %+v", i, *f.FreeRunning.Hier)
		}
		if f.Selector == "dense" {
			continue
		}
		if *f.TeacherForced.KLMean != *h.TeacherForced.KLMean || *f.TeacherForced.TokenAgreement != *h.TeacherForced.TokenAgreement {
			t.Errorf("line %d: teacher-forced KL %v / %v, agreement %v / %v", i, *f.TeacherForced.KLMean, *h.TeacherForced.KLMean, *f.TeacherForced.TokenAgreement, *h.TeacherForced.TokenAgreement)
		}
		for _, ph := range []*eval.Phase{h.FreeRunning, h.TeacherForced} {
			hs := ph.Hier
			if hs == nil {
				t.Fatalf("line %d: no hier counts", i)
			}
			if want := int64(ph.Steps * (layers - h.DenseLayers) * kvHeads); hs.Rows != want {
				t.Errorf("line %d: %d rows ranked, want %d (steps %d)", i, hs.Rows, want, ph.Steps)
			}
			if share := float64(hs.Boxes+hs.Pages) / float64(hs.Candidates); hs.Boxes == 0 || hs.Pages == 0 || share != hs.RecordsShare {
				t.Errorf("line %d: %+v", i, *hs)
			}
		}
	}
}

// TestEvalTopP: --attn-top-p reports one pruned row per (step, sparse
// layer, KV head) with at most its candidates kept, and p = 1 (off)
// gives the same answers and teacher-forced KL as no flag, with no
// counts.
func TestEvalTopP(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	run := func(extra ...string) []eval.Record {
		t.Helper()
		args := append([]string{"passkey", "--model", v1, "--lengths", "1024", "--n", "2", "--budgets", "64", "--no-diagnostics", "--json"}, extra...)
		code, out, errs := call(evalCmd, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", extra, code, errs)
		}
		var recs []eval.Record
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var r eval.Record
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		if len(recs) != 2 {
			t.Fatalf("%v: %d lines", extra, len(recs))
		}
		return recs
	}
	plain, one, half := run(), run("--attn-top-p", "1"), run("--attn-top-p", "0.5")
	const kvHeads, layers = 2, 6 // the v1 model
	q, o, h := plain[1], one[1], half[1]
	if q.Correct != o.Correct || *q.TeacherForced.KLMean != *o.TeacherForced.KLMean || o.FreeRunning.TopP != nil {
		t.Errorf("p = 1: correct %d / %d, KL %v / %v, counts %+v", o.Correct, q.Correct, *o.TeacherForced.KLMean, *q.TeacherForced.KLMean, o.FreeRunning.TopP)
	}
	for _, ph := range []*eval.Phase{h.FreeRunning, h.TeacherForced} {
		c := ph.TopP
		if c == nil {
			t.Fatal("p = 0.5: no top_p counts")
		}
		if want := int64(ph.Steps * (layers - h.DenseLayers) * kvHeads); c.Rows != want {
			t.Errorf("%d rows pruned, want %d (steps %d)", c.Rows, want, ph.Steps)
		}
		if c.Kept < c.Rows || c.Kept >= c.Tokens || c.KeptP50 > c.KeptP95 || c.KeptP95 > c.KeptMax || float64(c.KeptMax) < c.KeptPerRow {
			t.Errorf("p = 0.5 counts %+v", *c)
		}
	}
}

func TestEvalFlags(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	code, out, errs := call(evalCmd, "passkey", "--help")
	if code != 0 || errs != "" || !strings.HasPrefix(out, "Usage: questctl eval passkey") || !strings.Contains(out, "Flags:") {
		t.Errorf("--help: exit %d, stderr %q, stdout %.60q", code, errs, out)
	}
	for _, c := range []struct {
		args []string
		flag string
	}{
		{nil, "passkey"},
		{[]string{"ruler"}, "ruler"},
		{[]string{"passkey"}, "--model"},
		{[]string{"passkey", "--model", v1, "--lengths", "2048,x"}, "--lengths"},
		{[]string{"passkey", "--model", v1, "--budgets", "8"}, "--budgets"},
		{[]string{"passkey", "--model", v1, "--selectors", "dense"}, "--selectors"},
		{[]string{"passkey", "--model", v1, "--n", "0"}, "--n"},
		{[]string{"passkey", "--model", v1, "--keys", "11"}, "--keys"},
		{[]string{"passkey", "--model", v1, "--depths", "1.5"}, "--depths"},
		{[]string{"passkey", "--model", v1, "--keys", "2", "--depths", "0.1,0.2,0.3"}, "--depths"},
		{[]string{"passkey", "--model", v1, "--prompts", "/nonexistent"}, "--prompts"},
		{[]string{"passkey", "--model", v1, "--lengths", "40000"}, "positions"},
		{[]string{"passkey", "--model", v1, "--bogus"}, "bogus"},
		{[]string{"passkey", "--model", v1, "--hier-group", "1", "--no-diagnostics"}, "--hier-group"},
		{[]string{"passkey", "--model", v1, "--hier-group", "4"}, "--no-diagnostics"},
		{[]string{"passkey", "--model", v1, "--stop-rule", "--no-diagnostics"}, "--stop-rule"},
		{[]string{"passkey", "--model", v1, "--attn-top-p", "1.5"}, "--attn-top-p"},
		{[]string{"passkey", "--model", v1, "--sub-boxes", "3"}, "--sub-boxes"},
		{[]string{"passkey", "--model", v1, "--sub-boxes", "-1"}, "--sub-boxes"},
		{[]string{"passkey", "--model", v1, "--reuse-steps", "-1"}, "--reuse-steps"},
		{[]string{"passkey", "--model", v1, "--reuse-steps", "4097"}, "--reuse-steps"},
		{[]string{"passkey", "--model", v1, "--reuse-layers", "3,x"}, "--reuse-layers"},
		{[]string{"passkey", "--model", v1, "--reuse-layers", "5,3"}, "--reuse-layers"},
		{[]string{"passkey", "--model", v1, "--reuse-layers", "0"}, "--reuse-layers"},
		{[]string{"passkey", "--model", v1, "--reuse-layers", "2"}, "reuse layer"},
		{[]string{"passkey", "--model", v1, "--sub-boxes", "2", "--hier-group", "4", "--no-diagnostics"}, "--sub-boxes"},
		{[]string{"passkey", "--model", v1, "--attn-top-p", "-0.1"}, "--attn-top-p"},
		{[]string{"passkey", "--model", v1, "--attn-top-p", "NaN"}, "--attn-top-p"},
		{[]string{"passkey", "--model", v1, "--task", "ruler"}, "--task"},
		{[]string{"passkey", "--model", v1, "--offsets", "start"}, "--offsets"},
		{[]string{"passkey", "--model", v1, "--reversal-repeats", "3"}, "--reversal-repeats"},
		{[]string{"passkey", "--model", v1, "--reversal-align", "pad"}, "--reversal-align"},
		{[]string{"passkey", "--model", v1, "--task", "reversal", "--offsets", "start,top"}, "--offsets"},
		{[]string{"passkey", "--model", v1, "--task", "reversal", "--offsets", "16"}, "--offsets"},
		{[]string{"passkey", "--model", v1, "--task", "reversal", "--offsets", ""}, "--offsets"},
		{[]string{"passkey", "--model", v1, "--task", "reversal", "--reversal-repeats", "0"}, "--reversal-repeats"},
		{[]string{"passkey", "--model", v1, "--task", "reversal", "--reversal-align", "stretch"}, "--reversal-align"},
		{[]string{"passkey", "--model", v1, "--task", "reversal", "--keys", "2"}, "--keys"},
		{[]string{"passkey", "--model", v1, "--task", "reversal", "--depths", "0.1,0.2"}, "--depths"},
		{[]string{"passkey", "--model", v1, "--task", "reversal", "--depths", "1"}, "reversal"},
		{[]string{"passkey", "--model", v1, "--task", "reversal", "--prompts", "/nonexistent"}, "--prompts"},
		{[]string{"passkey", "--model", v1, "--task", "reversal", "--lengths", "300", "--page-size", "64"}, "reversal"},
	} {
		code, out, errs := call(evalCmd, c.args...)
		if code != 2 || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, c.flag) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q (want exit 2 naming %s)", c.args, code, out, errs, c.flag)
		}
	}
}

// TestEvalReversal: --task reversal gives one row per (offset, selector,
// budget), the JSON lines naming task and offset, the progress lines the
// answer's token; the table has an offset column.
func TestEvalReversal(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	code, out, errs := call(evalCmd, "passkey", "--model", v1, "--task", "reversal", "--reversal-repeats", "3", "--lengths", "1024", "--n", "2", "--offsets", "start,end", "--budgets", "32", "--selectors", "quest,recent", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2*3 {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	for i, l := range lines {
		var r eval.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		offset := []string{"start", "end"}[i/3]
		sel := []string{"dense", "quest", "recent"}[i%3]
		if r.Task != "reversal" || r.Offset != offset || r.Selector != sel || r.N != 2 || r.Length != 1024 {
			t.Errorf("line %d: %+v (want offset %s, selector %s)", i, r, offset, sel)
		}
	}
	for _, want := range []string{"prompt 4/4", "offset start: token ", "offset end: token ", " + 0, distractor ", " + 15, distractor "} {
		if !strings.Contains(errs, want) {
			t.Errorf("progress lacks %q:\n%s", want, errs)
		}
	}
	code, out, errs = call(evalCmd, "passkey", "--model", v1, "--task", "reversal", "--reversal-align", "pad", "--lengths", "1024", "--n", "1", "--offsets", "5", "--budgets", "64")
	if code != 0 || !strings.HasPrefix(out, "offset   length") || !strings.Contains(out, "\n5        1024     quest") || !strings.Contains(errs, " + 5, distractor ") {
		t.Fatalf("exit %d, stdout %q, stderr %s", code, out, errs)
	}
	// The plain task's lines keep their shape.
	code, out, errs = call(evalCmd, "passkey", "--model", v1, "--lengths", "512", "--n", "1", "--budgets", "64", "--json")
	if code != 0 || strings.Contains(out, `"task"`) || strings.Contains(out, `"offset"`) || strings.Contains(out, `"distractor_answers"`) {
		t.Fatalf("exit %d, stdout %q, stderr %s", code, out, errs)
	}
}

// TestEvalSubBoxes: --sub-boxes 1 is plain Quest (the same records),
// and --sub-boxes 4 reaches the page ranking: the same pages are read,
// while the mass the selection keeps changes.
func TestEvalSubBoxes(t *testing.T) {
	run := func(extra ...string) eval.Record { return evalRecord(t, 2, extra...) }
	plain, one, four := run(), run("--sub-boxes", "1"), run("--sub-boxes", "4")
	pj, _ := json.Marshal(plain)
	oj, _ := json.Marshal(one)
	if string(pj) != string(oj) {
		t.Errorf("--sub-boxes 1 differs from plain Quest:\n%s\n%s", oj, pj)
	}
	if four.TeacherForced.PagesRead != plain.TeacherForced.PagesRead {
		t.Errorf("--sub-boxes 4 read %d pages, plain %d (the budget is in pages)", four.TeacherForced.PagesRead, plain.TeacherForced.PagesRead)
	}
	same := true
	for i, l := range four.TeacherForced.Layers {
		p := plain.TeacherForced.Layers[i]
		if l.MassRecall == nil || p.MassRecall == nil {
			t.Fatalf("layer %d: no mass recall (diagnostics on)", i)
		}
		if *l.MassRecall != *p.MassRecall {
			same = false
		}
	}
	if same {
		t.Error("--sub-boxes 4 kept the same mass as plain Quest in every layer: the option did not reach the ranking")
	}
}

// TestEvalReuseSteps: --reuse-steps 1 is plain Quest (the same records
// but for the echoed option), and --reuse-steps 4 reaches the decode
// steps: each sparse layer ranks at about one step in four (the first
// step of every fork ranks) and skips the others' score phases, which
// the phase reports per token.
func TestEvalReuseSteps(t *testing.T) {
	run := func(extra ...string) eval.Record {
		return evalRecord(t, 2, append([]string{"--decode-question"}, extra...)...)
	}
	plain, one, four := run(), run("--reuse-steps", "1"), run("--reuse-steps", "4")
	if one.ReuseSteps != 1 || four.ReuseSteps != 4 {
		t.Fatalf("echoed reuse steps %d and %d, want 1 and 4", one.ReuseSteps, four.ReuseSteps)
	}
	one.ReuseSteps = 0
	pj, _ := json.Marshal(plain)
	oj, _ := json.Marshal(one)
	if string(pj) != string(oj) {
		t.Errorf("--reuse-steps 1 differs from plain Quest:\n%s\n%s", oj, pj)
	}
	if plain.FreeRunning.Reuse != nil {
		t.Errorf("plain Quest reports reuse %+v", *plain.FreeRunning.Reuse)
	}
	ru := four.FreeRunning.Reuse
	if ru == nil {
		t.Fatal("--reuse-steps 4: no reuse counts")
	}
	sparse := len(four.FreeRunning.Layers) - four.DenseLayers
	steps := four.FreeRunning.Steps
	if ru.Ranked+ru.Skipped != sparse*steps {
		t.Errorf("ranked %d + skipped %d layer steps, want %d sparse layers x %d steps", ru.Ranked, ru.Skipped, sparse, steps)
	}
	// Each fork ranks at its first step, then every 4th: at least a
	// quarter of the sparse layer steps rank, and fewer than half.
	if 4*ru.Ranked < sparse*steps || 2*ru.Ranked >= sparse*steps {
		t.Errorf("ranked %d of %d sparse layer steps, want about a quarter", ru.Ranked, sparse*steps)
	}
	if got := ru.ScorePhasesSavedPerTok; math.Abs(got-float64(ru.Skipped)/float64(steps)) > 1e-12 {
		t.Errorf("score phases saved per token %v, want %d / %d", got, ru.Skipped, steps)
	}
}

// TestEvalReuseLayers: --reuse-layers 3,5 reaches the decode steps:
// layers 3 and 5 take the selection of layers 2 and 4 at every step
// (the overlap diagnostic of those pairs is 1), layers 2 and 4 rank, and
// the phase counts two score phases saved per token; plain Quest reports
// no reuse and an overlap below 1.
func TestEvalReuseLayers(t *testing.T) {
	run := func(extra ...string) eval.Record {
		return evalRecord(t, 1, append([]string{"--decode-question"}, extra...)...)
	}
	plain, lr := run(), run("--reuse-layers", "3,5")
	if !slices.Equal(lr.ReuseLayers, []int{3, 5}) || plain.ReuseLayers != nil {
		t.Fatalf("echoed reuse layers %v and %v", lr.ReuseLayers, plain.ReuseLayers)
	}
	if plain.FreeRunning.Reuse != nil {
		t.Errorf("plain Quest reports reuse %+v", *plain.FreeRunning.Reuse)
	}
	for _, o := range plain.FreeRunning.LayerOverlap {
		if o.Samples == 0 || o.Share >= 1 || o.Jaccard > o.Share {
			t.Errorf("plain Quest overlap %+v", o)
		}
	}
	ru := lr.FreeRunning.Reuse
	if ru == nil {
		t.Fatal("--reuse-layers 3,5: no reuse counts")
	}
	steps := lr.FreeRunning.Steps
	if ru.Skipped != 2*steps || ru.Ranked != 2*steps || ru.ScorePhasesSavedPerTok != 2 {
		t.Errorf("ranked %d, skipped %d over %d steps (saved %v per token), want 2 and 2 per step", ru.Ranked, ru.Skipped, steps, ru.ScorePhasesSavedPerTok)
	}
	for _, o := range lr.FreeRunning.LayerOverlap {
		reused := o.Layers[1] == 3 || o.Layers[1] == 5
		if reused != (o.Share == 1 && o.Jaccard == 1) {
			t.Errorf("overlap %+v with layers 3 and 5 reusing", o)
		}
	}
}

// TestEvalStopRule: --stop-rule adds, after the records, one stop-rule
// line per (length, budget) whose rows count every (teacher-forced step,
// sparse layer, query head), whose searches were exact, and whose
// opened pages stay within the candidates; it leaves the records as they
// are without it.
func TestEvalStopRule(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	run := func(extra ...string) (recs []eval.Record, stops []eval.StopReport) {
		t.Helper()
		args := append([]string{"passkey", "--model", v1, "--lengths", "1024", "--n", "2", "--budgets", "32,64", "--json"}, extra...)
		code, out, errs := call(evalCmd, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", extra, code, errs)
		}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var sr struct {
				Stop *eval.StopReport `json:"stop_rule"`
			}
			if err := json.Unmarshal([]byte(l), &sr); err != nil {
				t.Fatal(err)
			}
			if sr.Stop != nil {
				stops = append(stops, *sr.Stop)
				continue
			}
			var r eval.Record
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		return recs, stops
	}
	plain, none := run()
	recs, stops := run("--stop-rule")
	if len(none) != 0 || len(stops) != 2 || len(recs) != len(plain) {
		t.Fatalf("%d stop lines without the flag, %d with it; %d / %d records", len(none), len(stops), len(plain), len(recs))
	}
	const qHeads, layers = 8, 6 // the v1 model
	for i, st := range stops {
		r := recs[i+1] // after dense
		if st.Budget != r.Budget || *r.TeacherForced.KLMean != *plain[i+1].TeacherForced.KLMean {
			t.Errorf("stop line %d: budget %d, record %d; KL %v without the flag %v", i, st.Budget, r.Budget, *r.TeacherForced.KLMean, *plain[i+1].TeacherForced.KLMean)
		}
		if want := r.TeacherForced.Steps * (layers - r.DenseLayers) * qHeads; st.Rows != want {
			t.Errorf("budget %d: %d rows, want %d", st.Budget, st.Rows, want)
		}
		if len(st.BnB) != 3 || st.Quest != float64(st.Budget/16-1) {
			t.Errorf("budget %d: %+v", st.Budget, st)
		}
		for _, b := range st.BnB {
			if b.Inexact != 0 || b.Mean > st.Ranked || b.Fallback < 0 || b.Fallback > 1 {
				t.Errorf("budget %d batch %d: %+v (ranked %v)", st.Budget, b.Batch, b, st.Ranked)
			}
		}
		if st.Gap == nil || st.Gap.Mean < float64(st.Gap.K0) || st.Gap.Mean > float64(st.Gap.K1) || st.Gap.DevRows+st.Gap.TestRows != st.Rows {
			t.Errorf("budget %d: gap %+v", st.Budget, st.Gap)
		}
	}
}

// evalRecord runs eval passkey on the v1 model (n 1K prompts, budget 64,
// Quest) with extra flags and returns its record.
func evalRecord(t *testing.T, n int, extra ...string) eval.Record {
	t.Helper()
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	args := append([]string{"passkey", "--model", v1, "--lengths", "1024", "--n", strconv.Itoa(n), "--budgets", "64", "--selectors", "quest", "--json"}, extra...)
	code, out, errs := call(evalCmd, args...)
	if code != 0 {
		t.Fatalf("%v: exit %d: %s", extra, code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r eval.Record
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestEvalTableLegend: the text table says what its columns are: the
// pages column is a share of the pages (not a count), and a legend under
// the rows names every column's meaning and unit.
func TestEvalTableLegend(t *testing.T) {
	agree, mass := 0.7, 0.31
	recs := []eval.Record{{Length: 2048, Selector: "quest", Budget: 64, N: 4, Accuracy: 0.25,
		TeacherForced: &eval.Phase{TokenAgreement: &agree, SparsePagesFraction: 0.031, SparseRho: 0.093, SparseRhoFormula: 0.093,
			Layers: []eval.LayerRecord{{MassRecall: &mass}}}}}
	var b bytes.Buffer
	printEvalTable(&b, recs)
	out := b.String()
	header, _, _ := strings.Cut(out, "\n")
	if !strings.Contains(header, " pages/P ") {
		t.Errorf("header %q: want the pages column named pages/P (a share)", header)
	}
	for _, want := range []string{"accuracy:", "agree:", "pages/P:", "rho:", "mass recall:"} {
		if !strings.Contains(out, want) {
			t.Errorf("table without %q in its legend:\n%s", want, out)
		}
	}
}
