package coord_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/cluster/node"
	"github.com/questrt/questrt/cluster/node/nodetest"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/decode/decodetest"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
)

// TestCoordinatorStepperConformance runs the decode.Stepper suite on a
// node's coordinator over a 2-node loopback cluster (gRPC workers, CP 2
// grids spanning both nodes): on one grid, and with the sequences spread
// over two grids (one engine step per grid, the grids concurrently).
func TestCoordinatorStepperConformance(t *testing.T) {
	for _, grids := range []int{1, 2} {
		t.Run(fmt.Sprintf("grids%d", grids), func(t *testing.T) {
			decodetest.Run(t, func(t *testing.T) decodetest.Subject {
				dc := decodetest.SuggestedConfig()
				ec := engine.DefaultConfig()
				ec.Layers, ec.Geometry, ec.Policy = dc.Layers, dc.Geometry, dc.Policy
				ec.CP, ec.CapacityPages, ec.Selection = 2, 64, plan.Exact
				ec.StepTimeout, ec.MemoryLimit = 2*time.Second, memlimit.NoLimit
				nodes := nodetest.Start(t, "s", 2, ec, nil)
				return coordSubject(t, nodes[0], ec, dc, grids)
			})
		})
	}
}

// coordSubject drives nd's coordinator; its sequences go round-robin
// over grids grids (configs that differ in their pools only).
func coordSubject(t *testing.T, nd *node.Node, ec engine.Config, dc decodetest.Config, grids int) decodetest.Subject {
	co := nd.Coordinator()
	var mu sync.Mutex
	ids := map[decode.SeqID]string{}
	n := 0
	return decodetest.Subject{Stepper: co, Config: dc,
		Create: func(ctx context.Context) (decode.SeqID, error) {
			c := ec
			mu.Lock()
			c.CapacityPages += n % grids
			n++
			mu.Unlock()
			cr, err := co.Create(ctx, plan.Striped, &c)
			if err != nil {
				return 0, err
			}
			h, err := co.Handle(cr.ID)
			if err != nil {
				return 0, err
			}
			mu.Lock()
			ids[h] = cr.ID
			mu.Unlock()
			return h, nil
		},
		Append: func(ctx context.Context, h decode.SeqID, layer int, k, v []float32) error {
			mu.Lock()
			id := ids[h]
			mu.Unlock()
			return co.Append(ctx, id, layer, k, v)
		},
		Len: func(_ context.Context, h decode.SeqID) (int, error) {
			mu.Lock()
			id := ids[h]
			mu.Unlock()
			return co.Len(id)
		},
	}
}

// TestClientStepperConformance runs the decode.Stepper suite on the Go
// client (cluster/client) over the Decode API's Steps stream of a node of
// a 2-node loopback cluster (CP 2 grids spanning both nodes), dialled at
// the coordinating node and at the other one (which relays the stream).
func TestClientStepperConformance(t *testing.T) {
	for _, at := range []int{0, 1} {
		t.Run(fmt.Sprintf("node%d", at), func(t *testing.T) {
			decodetest.Run(t, func(t *testing.T) decodetest.Subject {
				dc := decodetest.SuggestedConfig()
				ec := engine.DefaultConfig()
				ec.Layers, ec.Geometry, ec.Policy = dc.Layers, dc.Geometry, dc.Policy
				ec.CP, ec.CapacityPages, ec.Selection = 2, 64, plan.Exact
				ec.StepTimeout, ec.MemoryLimit = 2*time.Second, memlimit.NoLimit
				nodes := nodetest.Start(t, "c", 2, ec, nil)
				cl := dial(t, nodes[0])
				via := dial(t, nodes[at])
				var mu sync.Mutex
				ids := map[decode.SeqID]string{}
				return decodetest.Subject{Stepper: via, Config: dc,
					Create: func(ctx context.Context) (decode.SeqID, error) {
						id, _, err := cl.CreateWith(ctx, plan.Striped, ec.WorkerConfig())
						if err != nil {
							return 0, err
						}
						h := via.Handle(id)
						mu.Lock()
						ids[h] = id
						mu.Unlock()
						return h, nil
					},
					Append: func(ctx context.Context, h decode.SeqID, layer int, k, v []float32) error {
						mu.Lock()
						id := ids[h]
						mu.Unlock()
						return cl.Append(ctx, id, layer, k, v)
					},
					Len: func(ctx context.Context, h decode.SeqID) (int, error) {
						mu.Lock()
						id := ids[h]
						mu.Unlock()
						return cl.Len(ctx, id)
					},
				}
			})
		})
	}
}
