package main

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/node/nodetest"
)

// generate --addr decodes the passkey checkpoint with its KV pages on a
// 3-node cluster (a cluster whose defaults are another geometry: the
// sequence brings the model's), and produces the in-process run's text,
// plans and pages read, with diagnostics and a dense fork too.
func TestGenerateThroughCluster(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	nodes := nodetest.Start(t, "g", 3, engine.DefaultConfig(), nil)
	args := []string{"--model", v1, "--prompt", refPrompt, "--max-tokens", "5", "--budget", "32", "--cp", "2",
		"--compare-dense", "--diagnostics", "--json"}
	code, local, errs := call(generate, args...)
	if code != 0 {
		t.Fatalf("in process: exit %d: %s", code, errs)
	}
	code, remote, errs := call(generate, append(args, "--addr", nodes[0].Addr())...)
	if code != 0 {
		t.Fatalf("--addr: exit %d: %s", code, errs)
	}
	var a, b genSummary
	if err := json.Unmarshal([]byte(local), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(remote), &b); err != nil {
		t.Fatal(err)
	}
	// (Budget 32 at CP 2 reads too little to get the key right: the
	// point is that both runs generate the same.)
	if a.Text != b.Text || b.Dense == nil || b.Dense.Text != a.Dense.Text || a.Dense.Text != "48213" {
		t.Fatalf("text %q (dense %q) in process, %q through the cluster", a.Text, a.Dense.Text, b.Text)
	}
	for i := range a.Steps {
		x, y := a.Steps[i], b.Steps[i]
		if x.Token != y.Token || x.PagesRead != y.PagesRead || x.PagesTotal != y.PagesTotal || x.MassRecall != y.MassRecall || x.Recall != y.Recall {
			t.Fatalf("step %d: in process %+v, through the cluster %+v", i, x, y)
		}
	}
}
