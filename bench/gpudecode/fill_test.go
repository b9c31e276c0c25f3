package gpudecode

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// TestAppendTensorEqualsAppend: random K/V made on the twin and appended
// through engine.AppendTensor (the benchmark's fill) leave a sequence
// whose steps are bit for bit those of the same values appended from
// the host (engine.Append), in chunks that end inside a page; refused
// calls (host tensors, a shape that is not whole tokens, a layer out of
// range, memory the device never gave) change nothing.
func TestAppendTensorEqualsAppend(t *testing.T) {
	ctx := context.Background()
	dev := twin(t)
	e, id := appendTensorEngine(t, dev, plan.Float32)
	row := appendGeometry.KVHeads * appendGeometry.HeadDim
	d := dev.Device()
	bad := decode.OnDevice(d, 1<<40, row, 0)
	for name, call := range map[string]func() error{
		"host tensors": func() error {
			return e.AppendTensor(ctx, id, 0, decode.Host(make([]float32, row)), decode.Host(make([]float32, row)))
		},
		"not whole": func() error {
			return e.AppendTensor(ctx, id, 0, decode.OnDevice(d, 1<<40, row+1, 0), decode.OnDevice(d, 1<<40, row+1, 0))
		},
		"layer past":      func() error { return e.AppendTensor(ctx, id, 2, bad, bad) },
		"unknown pointer": func() error { return e.AppendTensor(ctx, id, 0, bad, bad) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if n, err := e.Len(id); err != nil || n != 0 {
			t.Fatalf("%s: the sequence holds %d tokens (%v) after a refused append", name, n, err)
		}
	}
	checkAppendTensor(t, dev, e, id, twin(t), plan.Float32)
}

// appendGeometry is the model shape of the AppendTensor tests.
var appendGeometry = model.Geometry{Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16}

// appendTensorEngine is an engine of 64 device-resident pages of dt on
// dev and an empty sequence in it, closed with the test.
func appendTensorEngine(t *testing.T, dev Device, dt plan.DType) (*engine.Engine, decode.SeqID) {
	t.Helper()
	pol := tinyPolicy()
	cfg := engine.ModelConfig(appendGeometry, pol, 64)
	cfg.Geometry.DType = dt
	cfg.Backend, cfg.DeviceResident = dev, true
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	id, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	return e, id
}

// checkAppendTensor appends random K/V made on dev to sequence id of e
// through appendRandomOn and the same values (downloaded) to a sequence
// of an engine on ref from the host, in chunks that end inside a page,
// then runs three steps of both: outputs equal bit for bit.
func checkAppendTensor(t *testing.T, dev Device, e *engine.Engine, id decode.SeqID, ref Device, dt plan.DType) {
	t.Helper()
	ctx := context.Background()
	g := appendGeometry
	row := g.KVHeads * g.HeadDim
	re, rid := appendTensorEngine(t, ref, dt)
	for l := range g.Layers {
		for i, n := range []int{37, 16, 100} {
			seed := uint64(10*l + i)
			if err := appendRandomOn(ctx, dev, e, id, l, n, row, seed, seed+100); err != nil {
				t.Fatal(err)
			}
			var kv [2][]float32
			for j, s := range []uint64{seed, seed + 100} {
				m, err := dev.RandomMatrix(ctx, n, row, plan.Float32, s, 1, 0)
				if err != nil {
					t.Fatal(err)
				}
				if kv[j], err = dev.DownloadTensor(ctx, decode.OnDevice(dev.Device(), m.Ptr, n*row, 0)); err != nil {
					t.Fatal(err)
				}
				dev.FreeMatrix(ctx, m)
			}
			if err := re.Append(rid, l, kv[0], kv[1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, err := e.Len(id); err != nil || n != 153 {
		t.Fatalf("the device-appended sequence holds %d tokens (%v), want 153", n, err)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	vec := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	for s := range 3 {
		for l := range g.Layers {
			q, k, v := vec(g.Heads*g.HeadDim), vec(row), vec(row)
			var got, want engine.Result
			if err := e.Step(ctx, l, []engine.Request{{Seq: id, Q: q, K: k, V: v}}, engine.StepOptions{}, &got); err != nil {
				t.Fatal(err)
			}
			if err := re.Step(ctx, l, []engine.Request{{Seq: rid, Q: q, K: k, V: v}}, engine.StepOptions{}, &want); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.O, want.O) || !slices.Equal(got.LSE, want.LSE) || len(got.O) != g.Heads*g.HeadDim {
				t.Fatalf("%v pages, step %d layer %d: the device-appended sequence attends differently from the host-appended one", dt, s, l)
			}
		}
	}
}
