package remote

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// countingBackend is a CPU backend that counts its kernel calls: which
// device a rank's shard runs on.
type countingBackend struct {
	*kernels.CPU
	calls atomic.Int64
}

func (c *countingBackend) Score(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, mode kernels.GQAMode, out []float32) error {
	c.calls.Add(1)
	return c.CPU.Score(ctx, s, l, b, q, mode, out)
}

func (c *countingBackend) Attend(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, lists *kernels.Lists, o, lse []float32) error {
	c.calls.Add(1)
	return c.CPU.Attend(ctx, s, l, b, q, lists, o, lse)
}

// TestRanksSpreadOverDevices hosts every rank of a CP 4 x TP 2 grid on one
// node with three devices (ServerConfig.Backends): the ranks spread 3, 3,
// 2 over them, every device runs kernels, and the outputs are
// bit-identical to an in-process engine's on one backend. A second grid
// fills the least-loaded devices first; closing the grids gives every
// device back.
func TestRanksSpreadOverDevices(t *testing.T) {
	devs := make([]*countingBackend, 3)
	bes := make([]kernels.Backend, len(devs))
	for i := range devs {
		devs[i] = &countingBackend{CPU: kernels.NewCPU(kernels.CPUConfig{Workers: 1})}
		bes[i] = devs[i]
		defer devs[i].Close()
	}
	cfg := DefaultServerConfig()
	cfg.Backends = bes
	nodes := startNodes(t, 1, cfg)
	srv := nodes[0].srv

	c := engineConfig(4, 2, plan.Exact)
	ref, err := engine.New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	rem, clients := openRemote(t, c, spread(c, conns(nodes), 0), "devices-a")
	if got := srv.Stats().RanksPerDevice; !slices.Equal(got, []int{3, 3, 2}) {
		t.Fatalf("ranks per device %v, want [3 3 2]", got)
	}
	w := &twin{t: t, c: c, ref: ref, rem: rem, rng: rand.New(rand.NewPCG(3, 9)), identical: true}
	a, b := w.create(plan.Striped), w.create(plan.Contiguous)
	w.fill(a, 120)
	w.fill(b, 90)
	for range 3 {
		w.decode([]engine.SeqID{a, b}, true, engine.StepOptions{})
	}
	if !w.identical {
		t.Fatalf("outputs differ from one backend's (largest relative difference %.3g)", w.maxRel)
	}
	for i, d := range devs {
		if d.calls.Load() == 0 {
			t.Fatalf("device %d ran no kernel", i)
		}
	}

	c2 := engineConfig(2, 1, plan.Exact)
	_, clients2 := openRemote(t, c2, spread(c2, conns(nodes), 0), "devices-b")
	if got := srv.Stats().RanksPerDevice; !slices.Equal(got, []int{4, 3, 3}) {
		t.Fatalf("after a second grid of 2 ranks: ranks per device %v, want [4 3 3]", got)
	}
	ctx := context.Background()
	if err := CloseGrid(ctx, clients2...); err != nil {
		t.Fatal(err)
	}
	rem.Close()
	if err := CloseGrid(ctx, clients...); err != nil {
		t.Fatal(err)
	}
	if got := srv.Stats().RanksPerDevice; !slices.Equal(got, []int{0, 0, 0}) {
		t.Fatalf("after closing the grids: ranks per device %v", got)
	}
	cfg.Backend, cfg.Plaintext = devs[0], true
	if _, err := NewServer(cfg); err == nil || !strings.Contains(err.Error(), "Backend or Backends") {
		t.Fatalf("a config with both Backend and Backends: %v", err)
	}
}
