package model

import "testing"

// TestExample8BConfig: examples/llama-3.1-8b/config.json parses into the
// Llama-3.1-8B shape (8.03 B parameters, untied) with Llama 3.1 RoPE
// scaling.
func TestExample8BConfig(t *testing.T) {
	c, err := ReadConfig("../examples/llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.HiddenSize != 4096 || c.Layers != 32 || c.Heads != 32 || c.KVHeads != 8 || c.HeadDim != 128 || c.IntermediateSize != 14336 || c.VocabSize != 128256 {
		t.Fatalf("shape %+v", c)
	}
	if p := c.Params(); p < 8.02e9 || p > 8.04e9 {
		t.Errorf("%d parameters, want 8.03 B", p)
	}
	if c.RopeScaling == nil || c.RopeScaling.Kind() != "llama3" {
		t.Errorf("rope scaling %+v, want llama3", c.RopeScaling)
	}
}
