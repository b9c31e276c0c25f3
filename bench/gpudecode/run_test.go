package gpudecode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestRunTwin runs the whole benchmark on the CPU twin with random
// weights: one JSON line per decode measurement (Quest, then dense),
// then one per prefilled prompt, with the anchor's fields; the weights'
// progress goes to logf.
func TestRunTwin(t *testing.T) {
	pol := tinyPolicy()
	s := Spec{Model: tinyConfig(t), Prefill: []int{50, 200},
		Measure: Config{Contexts: []int{100}, Batches: []int{2}, Warmup: 1, Steps: 2, Policy: &pol, Dense: true, Seed: 5}}
	var out bytes.Buffer
	var log []string
	if err := Run(context.Background(), twin(t), s, &out, func(f string, a ...any) { log = append(log, fmt.Sprintf(f, a...)) }); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	want := []struct {
		mode string
		n    int // ctx or prompt
	}{{"quest", 100}, {"dense", 103}, {"prefill", 50}, {"prefill", 200}}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, w := range want {
		var r map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &r); err != nil {
			t.Fatalf("line %d %q: %v", i, lines[i], err)
		}
		key, speed := "ctx", "tokens_per_s"
		if w.mode == "prefill" {
			key, speed = "prompt", "prompt_tokens_per_s"
		}
		if r["runtime"] != "questrt" || r["mode"] != w.mode || r[key] != float64(w.n) || r["layers"] != float64(2) || !(r[speed].(float64) > 0) {
			t.Errorf("line %d: %s; want %s with %s %d", i, lines[i], w.mode, key, w.n)
		}
	}
	if len(log) < 2 || !strings.HasPrefix(log[0], "weights: ") || !strings.Contains(log[1], "GB on the GPU") {
		t.Errorf("progress %q", log)
	}
}
