package coord_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// TestGridIdleCloses: with GridIdle a grid that holds no sequence for
// that long is closed, on its nodes too: the pages its ranks reserved
// come back (no node keeps a pool for nobody), and the next Create
// opens a fresh grid. Creates and releases racing the idle timer never
// fail (a Create registering its sequence keeps the grid open).
func TestGridIdleCloses(t *testing.T) {
	const idle = 50 * time.Millisecond
	nodes := nodetest.Start(t, "idle", 2, geometry(2, 1), func(_ int, c *node.Config) {
		c.GridIdle = idle
		c.MaxPages = 4 * geometry(2, 1).CapacityPages
	})
	c := dial(t, nodes[0])
	used := func() (int, int) {
		u := 0
		for _, nd := range nodes {
			u += nd.Stats().PagesUsed
		}
		return u, nodes[0].Stats().GridsCoordinated
	}
	ctx, cancel := callCtx()
	defer cancel()
	id, _, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	if u, g := used(); u == 0 || g != 1 {
		t.Fatalf("after a create: %d pages reserved on the nodes, %d grids; want some and 1", u, g)
	}
	if err := c.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		u, g := used()
		if u == 0 && g == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the last release: %d pages still reserved, %d grids open; want the idle grid closed", time.Since(deadline.Add(-5*time.Second)), u, g)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Creates and releases around the idle timer: every call succeeds.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 4 {
		wg.Go(func() {
			for i := range 8 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				id, _, err := c.Create(ctx, plan.Striped)
				if err == nil {
					time.Sleep(time.Duration((w*8+i)%5) * idle / 4)
					err = c.Release(ctx, id)
				}
				cancel()
				if err != nil {
					errs <- err
					return
				}
				time.Sleep(time.Duration(i%3) * idle / 2)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("create or release around the idle timer: %v", err)
	}
}
