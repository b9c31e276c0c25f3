package engine

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// TestAdoptSpentContextKeepsSequence: an Adopt whose context has run
// out fails its first claim; the sequence, intact on both workers, is
// left parked (ErrParked), not freed, and the next restart recovers it.
func TestAdoptSpentContextKeepsSequence(t *testing.T) {
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	defer be.Close()
	cfg := adoptConfig(be)
	g := &persistGrid{t: t, cfg: cfg, be: be}
	dirs := []string{t.TempDir(), t.TempDir()}
	g.open(dirs)
	rng := rand.New(rand.NewPCG(3, 3))
	tok := cfg.KVRow()
	a, err := g.eng.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	for l := range cfg.Layers {
		if err := g.eng.Append(a, l, randVec(rng, 16*tok), randVec(rng, 16*tok)); err != nil {
			t.Fatal(err)
		}
	}
	g.close() // graceful: everything persisted

	g.open(dirs)
	recs := g.recovered()
	if len(recs) != 1 {
		t.Fatalf("recovered %+v", recs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the adoption deadline already spent
	_, err = g.eng.Adopt(ctx, recs[0])
	t.Logf("adopt with a spent context: %v", err)
	if !errors.Is(err, ErrParked) || errors.Is(err, ErrIncomplete) {
		t.Errorf("adopt with a spent context: %v, want ErrParked", err)
	}
	g.close()

	g.open(dirs)
	defer g.close()
	if recs := g.recovered(); len(recs) != 1 {
		t.Fatalf("after an Adopt that failed on its context, the next restart recovers %d sequences, want the 1 both workers held intact", len(recs))
	}
}

// lateClaim claims on its worker, then reports the deadline (the reply
// lost to the caller's timeout after the worker acted).
type lateClaim struct{ *worker.Local }

func (w lateClaim) Claim(ctx context.Context, key, seq uint64) error {
	if err := w.Local.Claim(ctx, key, seq); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// TestAdoptLostClaimReplyParks: when a worker's Claim took effect but
// its answer did not come back, Adopt parks the sequence again on that
// worker (and leaves it parked on the others): no worker keeps a live
// sequence nobody owns, and a later adoption over the same workers
// claims it whole.
func TestAdoptLostClaimReplyParks(t *testing.T) {
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	defer be.Close()
	cfg := adoptConfig(be)
	g := &persistGrid{t: t, cfg: cfg, be: be}
	dirs := []string{t.TempDir(), t.TempDir()}
	g.open(dirs)
	rng := rand.New(rand.NewPCG(3, 3))
	tok := cfg.KVRow()
	a, err := g.eng.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	for l := range cfg.Layers {
		if err := g.eng.Append(a, l, randVec(rng, 16*tok), randVec(rng, 16*tok)); err != nil {
			t.Fatal(err)
		}
	}
	g.close()

	g.open(dirs)
	defer g.close()
	recs := g.recovered()
	g.eng.Close()
	hosts := []Host{{Worker: lateClaim{g.locals[0]}, Ranks: []worker.Rank{{CP: 0}}}, {Worker: g.locals[1], Ranks: []worker.Rank{{CP: 1}}}}
	e, err := Open(cfg, hosts)
	if err != nil {
		t.Fatal(err)
	}
	g.eng = e
	_, err = e.Adopt(context.Background(), recs[0])
	t.Logf("adopt: %v", err)
	if !errors.Is(err, ErrParked) {
		t.Errorf("adopt with a lost claim reply: %v, want ErrParked", err)
	}
	for w, l := range g.locals {
		used := l.Shard(worker.Rank{CP: w}).Store().Stats().UsedPages
		parked := slices.Contains(l.Parked(), recs[0].Parts[w].Key)
		if _, serr := l.StoreSeq(uint64(a), worker.Rank{CP: w}); serr == nil || (used != 0 && !parked) {
			t.Errorf("worker %d after the failed adoption: sequence %d live (%v), %d pages used; parked %v", w, a, serr == nil, used, l.Parked())
		}
	}
	// Parked again as recovered: an engine over the plain workers adopts it.
	e.Close()
	e, err = Open(cfg, []Host{{Worker: g.locals[0], Ranks: []worker.Rank{{CP: 0}}}, {Worker: g.locals[1], Ranks: []worker.Rank{{CP: 1}}}})
	if err != nil {
		t.Fatal(err)
	}
	g.eng = e
	ad, err := e.Adopt(context.Background(), recs[0])
	if err != nil {
		t.Fatalf("adopt after the failed one: %v", err)
	}
	if n, err := e.Len(a); err != nil || n != 16 || ad.LostTokens() != 0 {
		t.Errorf("adopted again: len %d (%v), adopted %+v, want 16 tokens", n, err, ad)
	}
	if err := e.Release(a); err != nil {
		t.Fatal(err)
	}
	for w, l := range g.locals {
		if u := l.Shard(worker.Rank{CP: w}).Store().Stats().UsedPages; u != 0 || len(l.Parked()) != 0 {
			t.Errorf("worker %d after the release: %d pages used, parked %v", w, u, l.Parked())
		}
	}
}
