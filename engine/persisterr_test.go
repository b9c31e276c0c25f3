package engine

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// TestPersistErrorBreaksSequence: an append whose page reaches one rank's
// memory but not its disk (the rank's directory removed: every page
// write fails) breaks the sequence, as the worker says it changed: the
// append's error wraps pagestore.ErrPersist and worker.ErrChanged, the
// next append of the same tokens gets ErrBroken (never a length mismatch
// against what the rank already holds, which would leave the sequence
// wedged), and another sequence on the healthy rank is untouched.
func TestPersistErrorBreaksSequence(t *testing.T) {
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	defer be.Close()
	cfg := adoptConfig(be)
	g := &persistGrid{t: t, cfg: cfg, be: be, onWrite: true}
	g.open([]string{t.TempDir(), t.TempDir()})
	defer g.close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 9))
	tok := cfg.KVRow()
	a, err := g.eng.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	// Four tokens: page 0 (rank 0) sealed and written.
	for l := range cfg.Layers {
		if err := g.eng.AppendContext(ctx, a, l, randVec(rng, 4*tok), randVec(rng, 4*tok)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(worker.RankDir(g.dirs[1], worker.Rank{CP: 1})); err != nil {
		t.Fatal(err)
	}
	// Four more fill page 1, rank 1's: the last layer's append writes it,
	// into its memory and not onto its disk.
	k, v := randVec(rng, 4*tok), randVec(rng, 4*tok)
	layer := 0
	for ; layer < cfg.Layers; layer++ {
		if err = g.eng.AppendContext(ctx, a, layer, k, v); err != nil {
			break
		}
	}
	if !errors.Is(err, pagestore.ErrPersist) || !errors.Is(err, worker.ErrChanged) {
		t.Fatalf("append whose page cannot be written: %v, want ErrPersist and worker.ErrChanged", err)
	}
	t.Logf("layer %d: %v", layer, err)
	err = g.eng.AppendContext(ctx, a, layer, k, v)
	if !errors.Is(err, ErrBroken) || errors.Is(err, ErrBadInput) {
		t.Fatalf("the append again: %v, want ErrBroken", err)
	}
	if n, err := g.eng.Len(a); err != nil && !errors.Is(err, ErrBroken) {
		t.Errorf("Len of the broken sequence: %d, %v", n, err)
	}
	if err := g.eng.Release(a); err != nil {
		t.Errorf("release of the broken sequence: %v", err)
	}
}
