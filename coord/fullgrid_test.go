package coord_test

import (
	"testing"
	"time"

	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// TestFullGridPlacesAgain: a grid whose ranks took every page of its
// nodes still takes the next sequence of its config once the nodes
// advertise no free page (placement counts the coordinator's own grids
// of that config as free on their nodes, so it finds the grid again),
// and the reserved pages stay those of one grid.
func TestFullGridPlacesAgain(t *testing.T) {
	geo := geometry(2, 1)
	nodes := nodetest.Start(t, "fullgrid", 2, geo, func(_ int, c *node.Config) { c.MaxPages = geo.CapacityPages })
	c := dial(t, nodes[0])
	ctx, cancel := callCtx()
	defer cancel()
	first, _, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	// The nodes advertise their pages taken (every MetaInterval).
	deadline := time.Now().Add(10 * time.Second)
	for {
		free, err := nodes[0].Coordinator().Placeable(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(free) == 2 && free[0].FreePages == 0 && free[1].FreePages == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes advertise %v, want no free page", free)
		}
		time.Sleep(20 * time.Millisecond)
	}
	second, _, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatalf("a second sequence on the full grid: %v", err)
	}
	if g := nodes[0].Stats().GridsCoordinated; g != 1 {
		t.Errorf("%d grids, want the one", g)
	}
	for _, id := range []string{first, second} {
		if err := c.Release(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
