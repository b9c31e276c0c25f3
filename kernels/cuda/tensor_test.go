//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/decode/decodetest"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// TestTensorStepMatchesQueued runs the same decode steps on two
// device-resident shards of one GPU: one through the host path (Append,
// Step with Queue, host q and outputs), the other with every tensor in
// device memory (AppendTensor, BeginTensor, FusedStepTensor). The
// outputs are bit-identical: the device path reads the same values in
// place instead of uploading them.
func TestTensorStepMatchesQueued(t *testing.T) {
	const layers, qh, kvh, d, s = 4, 32, 8, 128, 16
	for _, dt := range []plan.DType{plan.Float32, plan.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) {
			be, err := New(Config{DType: dt})
			if err != nil {
				t.Fatal(err)
			}
			defer be.Close()
			pol := plan.DefaultPolicy()
			pol.DenseLayers = 1
			pol.BudgetTokens = 256
			cfg := shard.Config{Store: pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: 4 * 200},
				Policy: pol, DeviceResident: true}
			host, err := shard.New(cfg, be)
			if err != nil {
				t.Fatal(err)
			}
			defer host.Close()
			dev, err := shard.New(cfg, be)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			if got, ok := dev.TensorDevice(); !ok || got != be.Device() {
				t.Fatalf("TensorDevice = %v, %v", got, ok)
			}
			vec, up := normals(rand.New(rand.NewPCG(3, 4))), uploader(t, be)
			var hid, did []pagestore.SeqID
			for i := range 4 {
				a, b := host.Store().Create(), dev.Store().Create()
				n := 700 + 333*i + i%2*7 // tail pages of several lengths
				for l := range layers {
					k, v := vec(n*kvh*d), vec(n*kvh*d)
					if err := host.Append(a, l, k, v); err != nil {
						t.Fatal(err)
					}
					if err := dev.Append(b, l, k, v); err != nil {
						t.Fatal(err)
					}
				}
				hid, did = append(hid, a), append(did, b)
			}
			ctx := context.Background()
			var ls shard.LocalStep
			for round := range 5 { // crosses a page boundary for some sequences
				var want []shard.StepResult
				var outs []decode.Tensor
				for l := range layers {
					var reqs []shard.SeqStep
					var parts []shard.SeqPart
					var q []float32
					for i := range hid {
						qi, k, v := vec(qh*d), vec(kvh*d), vec(kvh*d)
						reqs = append(reqs, shard.SeqStep{Seq: hid[i], Q: qi, K: k, V: v})
						q = append(q, qi...)
						if err := dev.AppendTensor(did[i], l, up(k), up(v)); err != nil {
							t.Fatalf("round %d layer %d: append tensor: %v", round, l, err)
						}
					}
					var res shard.StepResult
					if err := host.Step(ctx, l, reqs, shard.StepOptions{}, &res); err != nil {
						t.Fatal(err)
					}
					want = append(want, res)
					for i := range did {
						pages := cfg.Store.Pages(mustLen(t, dev, did[i], l))
						pl, err := dev.Config().Policy.Plan(l, pages, 0)
						if err != nil {
							t.Fatal(err)
						}
						parts = append(parts, shard.SeqPart{Seq: did[i], Plan: pl})
					}
					if err := dev.BeginTensor(&ls, l, parts); err != nil {
						t.Fatal(err)
					}
					o, err := be.AllocTensor(len(q))
					if err != nil {
						t.Fatal(err)
					}
					lse, err := be.AllocTensor(len(hid) * qh)
					if err != nil {
						t.Fatal(err)
					}
					done, err := dev.FusedStepTensor(ctx, &ls, up(q), o, lse)
					if err != nil || !done {
						t.Fatalf("round %d layer %d: fused step on tensors: %v, %v", round, l, done, err)
					}
					outs = append(outs, o, lse)
				}
				if err := dev.Sync(ctx); err != nil {
					t.Fatal(err)
				}
				for l := range layers {
					o, err := be.DownloadTensor(ctx, outs[2*l])
					if err != nil {
						t.Fatal(err)
					}
					lse, err := be.DownloadTensor(ctx, outs[2*l+1])
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(o, want[l].O) || !slices.Equal(lse, want[l].LSE) {
						t.Fatalf("round %d layer %d: the step on device tensors differs from the host step", round, l)
					}
				}
			}
		})
	}
}

// normals returns a function that draws n standard normal floats from
// rng.
func normals(rng *rand.Rand) func(n int) []float32 {
	return func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
}

// uploader returns a function that copies x into a new device tensor of
// be (failing t on an error).
func uploader(t *testing.T, be *Backend) func(x []float32) decode.Tensor {
	return func(x []float32) decode.Tensor {
		tt, err := be.AllocTensor(len(x))
		if err != nil {
			t.Fatal(err)
		}
		if err := be.UploadTensor(tt, x); err != nil {
			t.Fatal(err)
		}
		return tt
	}
}

func mustLen(t *testing.T, sh *shard.Shard, id pagestore.SeqID, layer int) int {
	t.Helper()
	n, err := sh.Store().LayerLen(id, layer)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestEngineDeviceTensors runs the decode.Stepper conformance suite on
// an in-process engine of one rank whose pages live on the GPU, with q,
// k, v and the outputs in device memory: the engine takes them in place
// and matches the float64 reference.
func TestEngineDeviceTensors(t *testing.T) {
	for _, gqa := range []plan.GQAMode{plan.GroupMax, plan.PerHead} {
		t.Run(fmt.Sprint(gqa), func(t *testing.T) {
			decodetest.Run(t, func(t *testing.T) decodetest.Subject {
				be, err := New(Config{})
				if err != nil {
					t.Fatal(err)
				}
				dc := decodetest.SuggestedConfig()
				dc.Policy.GQA = gqa
				cfg := engine.DefaultConfig()
				cfg.Layers, cfg.Geometry, cfg.Policy = dc.Layers, dc.Geometry, dc.Policy
				cfg.CapacityPages = 64
				cfg.Backend, cfg.DeviceResident = be, true
				e, err := engine.New(cfg)
				if err != nil {
					be.Close()
					t.Fatal(err)
				}
				t.Cleanup(func() { e.Close(); be.Close() })
				return decodetest.Subject{Stepper: e, Config: dc, Tensors: be, Tol: 1e-3,
					Create: func(context.Context) (decode.SeqID, error) { return e.Create(plan.Striped) },
					Append: func(_ context.Context, id decode.SeqID, layer int, k, v []float32) error {
						return e.Append(id, layer, k, v)
					},
					Len: func(_ context.Context, id decode.SeqID) (int, error) { return e.Len(id) },
				}
			})
		})
	}
}

// TestKeptUploads runs the same decode steps with every tensor on the
// device (AppendTensor, BeginTensor, FusedStepTensor, the executor's
// path) on two backends: one skips an upload when the device holds its
// bytes (keptCopy), the other always uploads (AlwaysUpload). Outputs are
// bit-identical, and at batch 1 the Quest layers after a step's first
// one skip their inputs' copy: they have the same batch, page tables and
// plan, while their top-K wrote the previous layer's picks into the
// inputs' lists (a skipped copy leaves those; the top-K rewrites them).
func TestKeptUploads(t *testing.T) {
	const layers, qh, kvh, d, s, rounds = 5, 32, 8, 128, 16, 6
	for _, batch := range []int{1, 3} {
		t.Run(fmt.Sprintf("batch%d", batch), func(t *testing.T) {
			var outs [2][][]float32
			var skipped [2]int
			for bi, always := range []bool{false, true} {
				be, err := New(Config{DType: plan.BFloat16, AlwaysUpload: always})
				if err != nil {
					t.Fatal(err)
				}
				outs[bi] = keptUploadSteps(t, be, batch, layers, rounds, qh, kvh, d, s)
				skipped[bi] = be.skipped
				be.Close()
			}
			for i := range outs[0] {
				if !slices.Equal(outs[0][i], outs[1][i]) {
					t.Fatalf("output %d (round %d, layer %d, o/lse %d) differs between skipped and repeated uploads", i, i/(2*layers), i/2%layers, i%2)
				}
			}
			// Layer 0 is dense and layer 1 the first Quest layer of a
			// step: layers 2.. repeat layer 1's inputs.
			if want := rounds * (layers - 2); batch == 1 && skipped[0] < want {
				t.Fatalf("batch 1: %d uploads skipped, want at least %d", skipped[0], want)
			}
			if skipped[1] != 0 {
				t.Fatalf("AlwaysUpload skipped %d uploads", skipped[1])
			}
			t.Logf("batch %d: %d uploads skipped in %d rounds of %d layers", batch, skipped[0], rounds, layers)
		})
	}
}

// keptUploadSteps runs rounds decode steps of batch sequences (contexts of
// 700.. tokens, budget 256) over layers layers on be with device tensors
// and returns each layer's o and lse in order.
func keptUploadSteps(t *testing.T, be *Backend, batch, layers, rounds, qh, kvh, d, s int) [][]float32 {
	t.Helper()
	pol := plan.DefaultPolicy()
	pol.DenseLayers = 1
	pol.BudgetTokens = 256
	cfg := shard.Config{Store: pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: 4 * 200},
		Policy: pol, DeviceResident: true}
	sh, err := shard.New(cfg, be)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	vec, up := normals(rand.New(rand.NewPCG(5, 6))), uploader(t, be)
	var ids []pagestore.SeqID
	for i := range batch {
		id := sh.Store().Create()
		n := 700 + 333*i + 13 // crosses a page boundary within the rounds
		for l := range layers {
			if err := sh.Append(id, l, vec(n*kvh*d), vec(n*kvh*d)); err != nil {
				t.Fatal(err)
			}
		}
		ids = append(ids, id)
	}
	ctx := context.Background()
	var ls shard.LocalStep
	var res [][]float32
	for round := range rounds {
		var ts []decode.Tensor
		for l := range layers {
			var parts []shard.SeqPart
			for _, id := range ids {
				if err := sh.AppendTensor(id, l, up(vec(kvh*d)), up(vec(kvh*d))); err != nil {
					t.Fatalf("round %d layer %d: append tensor: %v", round, l, err)
				}
				pl, err := cfg.Policy.Plan(l, cfg.Store.Pages(mustLen(t, sh, id, l)), 0)
				if err != nil {
					t.Fatal(err)
				}
				parts = append(parts, shard.SeqPart{Seq: id, Plan: pl})
			}
			if err := sh.BeginTensor(&ls, l, parts); err != nil {
				t.Fatal(err)
			}
			o, err := be.AllocTensor(batch * qh * d)
			if err != nil {
				t.Fatal(err)
			}
			lse, err := be.AllocTensor(batch * qh)
			if err != nil {
				t.Fatal(err)
			}
			if done, err := sh.FusedStepTensor(ctx, &ls, up(vec(batch*qh*d)), o, lse); err != nil || !done {
				t.Fatalf("round %d layer %d: fused step on tensors: %v, %v", round, l, done, err)
			}
			ts = append(ts, o, lse)
		}
		if err := sh.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		for _, tt := range ts {
			x, err := be.DownloadTensor(ctx, tt)
			if err != nil {
				t.Fatal(err)
			}
			res = append(res, x)
		}
	}
	return res
}
