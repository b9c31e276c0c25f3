package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestParkAndRenamedClaim: Park undoes a Claim (the sequence parked
// again under its key, the table entry back to its recovered id and
// grid, so the next restart recovers it as before); a Claim under a new
// id records the claiming grid; the entries keep the placement they
// were written with.
func TestParkAndRenamedClaim(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(Exact)
	cfg.GridID, cfg.Placement = "c/1/1", []string{"a", "b"}
	g := newGrid(t, cfg, false)
	dirs := []string{t.TempDir()}
	g.reopen(dirs)
	rng := rand.New(rand.NewPCG(1, 1))
	g.create(1, plan.Striped)
	g.appendAll(rng, 1, 20)
	g.create(2, plan.Striped)

	g.cfg.GridID, g.cfg.Placement = "c/2/1", []string{"a", "c"}
	g.reopen(dirs)
	l := g.workers[0].(*Local)
	rep := l.Recovery()
	if len(rep.Sequences) != 2 {
		t.Fatalf("recovered %+v", rep.Sequences)
	}
	r := rep.Sequences[0]
	if r.Seq != 1 || r.Grid != "c/1/1" || !slices.Equal(r.Placement, []string{"a", "b"}) {
		t.Fatalf("recovered %+v, want seq 1 of grid c/1/1 on [a b]", r)
	}
	g.must(l.Claim(ctx, rep.Sequences[1].Key, 2))
	if err := l.Park(ctx, 2); err != nil {
		t.Fatalf("park a claimed sequence: %v", err)
	}
	if err := l.Park(ctx, 2); !errors.Is(err, ErrUnknownSequence) {
		t.Errorf("park a parked sequence: %v, want ErrUnknownSequence", err)
	}
	g.must(l.Create(ctx, CreateRequest{Seq: 3, Layout: plan.Layout{CP: cfg.CP, TP: cfg.TP, Placement: plan.Striped, BlockPages: 1}}))
	if err := l.Park(ctx, 3); !errors.Is(err, ErrBadMessage) {
		t.Errorf("park a created sequence: %v, want ErrBadMessage", err)
	}
	g.must(l.Claim(ctx, r.Key, 9))
	if err := l.Park(ctx, 9); err != nil {
		t.Fatalf("park a sequence claimed under a new id: %v", err)
	}
	if p := l.Parked(); len(p) != 2 {
		t.Fatalf("parked %v after the parks, want both recovered keys", p)
	}

	g.reopen(dirs)
	l = g.workers[0].(*Local)
	rep = l.Recovery()
	if len(rep.Sequences) != 3 {
		t.Fatalf("after the parks, recovered %+v, want 1, 2 and the created 3", rep.Sequences)
	}
	if c := rep.Sequences[2]; c.Seq != 3 || c.Grid != "c/2/1" || !slices.Equal(c.Placement, []string{"a", "c"}) {
		t.Errorf("created sequence recovered as %+v, want seq 3 of grid c/2/1 on [a c]", c)
	}
	r = rep.Sequences[0]
	if r.Seq != 1 || r.Grid != "c/1/1" || r.Len() != 20 || !slices.Equal(r.Placement, []string{"a", "b"}) {
		t.Fatalf("after park and restart: recovered %+v, want seq 1 of grid c/1/1 on [a b], 20 tokens", r)
	}
	// Renamed: the entry names this grid, whose workers claimed it as 9.
	g.must(l.Claim(ctx, r.Key, 9))
	g.reopen(dirs)
	l = g.workers[0].(*Local)
	r = l.Recovery().Sequences[0]
	if r.Seq != 9 || r.Grid != "c/2/1" || r.Len() != 20 || !slices.Equal(r.Placement, []string{"a", "b"}) {
		t.Errorf("after a renamed claim and restart: recovered %+v, want seq 9 of grid c/2/1 on [a b], 20 tokens", r)
	}
}
