package gpu

import (
	"context"
	"errors"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
)

// TestDecoderMatchesDecodeBatch: the Decoder on the twin gives the logits
// model.Model.DecodeBatch gives on the CPU for the same sequences and
// tokens (within 1e-4, step after step), advances every sequence's
// length and records each layer's plan, as DecodeBatch does.
func TestDecoderMatchesDecodeBatch(t *testing.T) {
	ctx := context.Background()
	c := tinyConfig(t)
	m, err := model.NewRandom(c, model.RandomOptions{Seed: 9, Std: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	dev := twin(t)
	dcfg := engine.ModelConfig(m.Geometry(), testPolicy(), 256)
	dcfg.Backend, dcfg.DeviceResident = dev, true
	de, err := engine.New(dcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer de.Close()
	ce, err := engine.New(engine.ModelConfig(m.Geometry(), testPolicy(), 256))
	if err != nil {
		t.Fatal(err)
	}
	defer ce.Close()
	x, err := New(ctx, dev, m, Options{MaxBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(ctx)
	d := &Decoder{X: x}
	prompts := [][]int{make([]int, 500), make([]int, 260)}
	for i := range prompts[0] {
		prompts[0][i] = 3 + (i*13)%290
	}
	for i := range prompts[1] {
		prompts[1][i] = 5 + (i*i)%280
	}
	var devA, cpuA []model.Attention
	var toks []int
	for _, p := range prompts {
		for _, e := range []*engine.Engine{de, ce} {
			a, err := model.NewEngineAttention(e, m.Geometry())
			if err != nil {
				t.Fatal(err)
			}
			logits, err := m.Forward(ctx, a, p, model.ForwardOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if e == de {
				devA = append(devA, a)
				toks = append(toks, model.Argmax(logits))
			} else {
				cpuA = append(cpuA, a)
			}
		}
	}
	for step := range 12 {
		got, err := d.DecodeBatch(ctx, devA, toks)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		want, err := m.DecodeBatch(ctx, cpuA, toks)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if diff := maxDiff(got[i], want[i]); diff > 1e-4 {
				t.Fatalf("step %d row %d: logits differ by %g", step, i, diff)
			}
			if devA[i].Len() != cpuA[i].Len() || devA[i].Len() != len(prompts[i])+step+1 {
				t.Fatalf("step %d row %d: length %d on the device, %d on the CPU, want %d", step, i, devA[i].Len(), cpuA[i].Len(), len(prompts[i])+step+1)
			}
			checkSteps(t, devA[i].(*model.EngineAttention).Steps(), c.Layers, devA[i].Len()-1, testPolicy())
			toks[i] = model.Argmax(want[i])
		}
	}
	// Bad input changes nothing: the lengths stay, the next step matches.
	lens := []int{devA[0].Len(), devA[1].Len()}
	for name, call := range map[string]func() error{
		"no rows":    func() error { _, err := d.DecodeBatch(ctx, nil, nil); return err },
		"token past": func() error { _, err := d.DecodeBatch(ctx, devA, []int{toks[0], c.VocabSize}); return err },
		"twice":      func() error { _, err := d.DecodeBatch(ctx, []model.Attention{devA[0], devA[0]}, toks); return err },
		"not batchable": func() error {
			_, err := d.DecodeBatch(ctx, []model.Attention{model.NewReference(m.Geometry())}, toks[:1])
			return err
		},
		"tokens missing": func() error { _, err := d.DecodeBatch(ctx, devA, toks[:1]); return err },
	} {
		if err := call(); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", name, err)
		}
	}
	if devA[0].Len() != lens[0] || devA[1].Len() != lens[1] {
		t.Fatalf("refused calls changed the lengths: %d %d, were %v", devA[0].Len(), devA[1].Len(), lens)
	}
	got, err := d.DecodeBatch(ctx, devA, toks)
	if err != nil {
		t.Fatal(err)
	}
	want, err := m.DecodeBatch(ctx, cpuA, toks)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if diff := maxDiff(got[i], want[i]); diff > 1e-4 {
			t.Fatalf("after the refused calls, row %d: logits differ by %g", i, diff)
		}
		toks[i] = model.Argmax(want[i])
	}
	// An executor of one row decodes the two sequences one step each.
	x1, err := New(ctx, dev, m, Options{MaxBatch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer x1.Close(ctx)
	q0 := dev.Queued()
	if got, err = (&Decoder{X: x1}).DecodeBatch(ctx, devA, toks); err != nil {
		t.Fatal(err)
	}
	if want, err = m.DecodeBatch(ctx, cpuA, toks); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if diff := maxDiff(got[i], want[i]); diff > 1e-4 {
			t.Fatalf("MaxBatch 1, row %d: logits differ by %g", i, diff)
		}
	}
	if n := dev.Queued() - q0; n != 2*c.Layers {
		t.Errorf("MaxBatch 1: %d fused steps queued for 2 sequences of %d layers, want one per sequence and layer", n, c.Layers)
	}
}
