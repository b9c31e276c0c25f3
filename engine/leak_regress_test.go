package engine

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// countTr counts messages per (from, to, tag): +1 on Send, -1 on Recv.
type countTr struct {
	collective.Transport
	mu  *sync.Mutex
	pen map[[3]uint64]int
}

func (c countTr) Send(ctx context.Context, to int, tag uint64, msg []byte) error {
	err := c.Transport.Send(ctx, to, tag, msg)
	if err == nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.pen[[3]uint64{uint64(c.Rank()), uint64(to), tag}]++
	}
	return err
}

func (c countTr) Recv(ctx context.Context, from int, tag uint64) ([]byte, error) {
	m, err := c.Transport.Recv(ctx, from, tag)
	if err == nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.pen[[3]uint64{uint64(from), uint64(c.Rank()), tag}]--
	}
	return m, err
}

// TestRegressFailedStepLeavesNoMail: a rank failing after the selection
// aborts the select tag (peers already have its data) and the reduce tag
// at non-roots (never received): buffered forever, tags are not reused.
func TestRegressFailedStepLeavesNoMail(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	bad := &faultyBackend{Backend: cpu}
	cfg := reviewCfg()
	cfg.CP, cfg.CapacityPages = 4, 64
	cfg.Backends = func(tp, cp int) kernels.Backend {
		if cp == 2 {
			return bad
		}
		return cpu
	}
	var mu sync.Mutex
	pen := map[[3]uint64]int{}
	cfg.Transports = func(tp, n int) []collective.Transport {
		trs := collective.NewInprocGroup(n)
		for i := range trs {
			trs[i] = countTr{trs[i], &mu, pen}
		}
		return trs
	}
	e := newEngine(t, cfg)
	id, _ := e.Create(plan.Striped)
	tok := cfg.KVHeads * cfg.HeadDim
	if err := e.Append(id, 0, randVec(rng, 300*tok), randVec(rng, 300*tok)); err != nil {
		t.Fatal(err)
	}
	bad.mode.Store(1)
	var res Result
	if err := e.Step(context.Background(), 0, []Request{{Seq: id, Q: randVec(rng, cfg.QHeads*cfg.HeadDim), BudgetTokens: 64}}, StepOptions{}, &res); err == nil {
		t.Fatal("no error")
	}
	for tp := range e.trs {
		for r, tr := range e.trs[tp] {
			if n := tr.(countTr).Transport.(interface{ Pending() int }).Pending(); n != 0 {
				t.Errorf("tp %d rank %d: %d messages left buffered after the failed step", tp, r, n)
			}
		}
	}
}
