package gpudecode

import (
	"context"
	"errors"
	"testing"

	"github.com/questrt/questrt/model/gpu"
	"github.com/questrt/questrt/plan"
)

// TestCausalFLOPs: the closed form equals the sum over the prompt's
// positions of 4 d heads layers (p + 1), and the 8B shape's 128K prompt
// is the 4.5e15 the results cite.
func TestCausalFLOPs(t *testing.T) {
	for _, n := range []int{1, 2, 17, 1000} {
		sum := 0.0
		for p := range n {
			sum += 4 * 16 * 4 * 2 * float64(p+1)
		}
		if got := CausalFLOPs(n, 2, 4, 16); got != sum {
			t.Errorf("n %d: %v, by the sum %v", n, got, sum)
		}
	}
	if got := CausalFLOPs(131072, 32, 32, 128); got < 4.50e15 || got > 4.51e15 {
		t.Errorf("8B shape, 128K: %v, want about 4.5e15", got)
	}
}

// TestBenchPrefillPhases: with phases, MeasurePrefill runs one more
// prefill of each prompt with marks between every layer's phases of every
// chunk (one before a chunk's layers, three a layer: interval j of a
// chunk lasts j+1 ms on the marking twin), summed over chunks and layers
// per phase, and the attention's TFLOP/s is the causal arithmetic over
// the attention's sum; no mark is left queued, the timed runs and a run
// without phases queue none, and a device without marks is refused
// before anything runs.
func TestBenchPrefillPhases(t *testing.T) {
	ctx := context.Background()
	dev := &markingTwin{QueuedDevice: twin(t)}
	c := tinyConfig(t)
	x, err := gpu.NewRandom(ctx, dev, c, 3, gpu.Options{MaxBatch: 1, PrefillChunk: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(ctx)
	prompts := []int{20, 70} // 1 and 3 chunks of 32
	var got []PrefillResult
	if err := MeasurePrefill(ctx, dev, x, prompts, plan.BFloat16, 1, true, func(r PrefillResult) error { got = append(got, r); return nil }); err != nil {
		t.Fatal(err)
	}
	L := c.Layers
	var in, attn, out float64
	for l := range L {
		in += float64(3*l + 1)
		attn += float64(3*l + 2)
		out += float64(3*l + 3)
	}
	if len(got) != len(prompts) {
		t.Fatalf("%d results, want %d", len(got), len(prompts))
	}
	for i, r := range got {
		chunks := float64((prompts[i] + 31) / 32)
		want := gpu.PrefillPhases{In: chunks * in, Attention: chunks * attn, Out: chunks * out}
		if r.Phases == nil || *r.Phases != want {
			t.Fatalf("prompt %d: phases %+v, want %+v", prompts[i], r.Phases, want)
		}
		if w := CausalFLOPs(prompts[i], L, c.Heads, c.HeadDim) / (want.Attention * 1e-3) / 1e12; r.AttentionTFLOPs != w {
			t.Errorf("prompt %d: %v TFLOP/s, want %v", prompts[i], r.AttentionTFLOPs, w)
		}
	}
	// One marked run per prompt: a chunk's 1 + 3L marks each.
	if want := (1 + 3) * (1 + 3*L); dev.total != want || dev.marks != 0 {
		t.Errorf("%d marks in all (%d left queued), want %d, none left", dev.total, dev.marks, want)
	}
	total := dev.total
	if err := MeasurePrefill(ctx, dev, x, prompts, plan.BFloat16, 1, false, func(r PrefillResult) error {
		if r.Phases != nil || r.AttentionTFLOPs != 0 {
			t.Errorf("prompt %d without phases: %+v", r.Prompt, r)
		}
		return nil
	}); err != nil || dev.total != total {
		t.Errorf("without phases: %v, %d marks", err, dev.total-total)
	}
	plain := twin(t)
	px, err := gpu.NewRandom(ctx, plain, c, 3, gpu.Options{MaxBatch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close(ctx)
	err = MeasurePrefill(ctx, plain, px, prompts, plan.BFloat16, 1, true, func(PrefillResult) error { t.Error("a result without marks"); return nil })
	if !errors.Is(err, gpu.ErrBadInput) {
		t.Fatalf("no marks: %v, want gpu.ErrBadInput", err)
	}
}
