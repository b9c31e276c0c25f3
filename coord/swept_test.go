package coord_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/coord"
	"github.com/questrt/questrt/plan"
)

// TestSweptGridIsLost: a node that forgets a grid under a live sequence
// (it swept it while its view still showed the coordinator gone, after a
// partition healed: found by e2e TestChaos/partition) makes the
// sequence's next call fail UNAVAILABLE naming the grid's loss, whatever
// the call (not NOT_FOUND, which says the sequence id is wrong). A
// release then succeeds (the sequence went with its grid), the sequence
// is unknown afterwards, and a new sequence gets a fresh grid that works.
func TestSweptGridIsLost(t *testing.T) {
	ec := geometry(2, 1)
	nodes := startCluster(t, 2, ec)
	co := nodes[0].Coordinator()
	c := dial(t, nodes[0])
	conn, err := grpc.NewClient(nodes[1].Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w1 := workerv1.NewWorkerClient(conn)
	member, ok := nodes[0].Membership().View().Member(nodes[0].Name())
	if !ok {
		t.Fatal("n0 is not in its own view")
	}
	rng := rand.New(rand.NewPCG(7, 7))
	kvw := ec.KVHeads * ec.HeadDim
	const tokens = 9

	// fill creates a sequence through n0's coordinator (for the grid's
	// view) and appends tokens to every layer.
	grids := 0
	fill := func(ctx context.Context) coord.Created {
		t.Helper()
		cr, err := co.Create(ctx, plan.Striped, nil)
		if err != nil {
			t.Fatal(err)
		}
		grids++
		for l := range ec.Layers {
			if err := c.Append(ctx, cr.ID, l, randVec(rng, tokens*kvw), randVec(rng, tokens*kvw)); err != nil {
				t.Fatalf("append to a fresh sequence: %v", err)
			}
		}
		return cr
	}
	// sweep closes the grid on n1 only, as its sweep does.
	sweep := func(ctx context.Context, cr coord.Created) {
		t.Helper()
		grid := fmt.Sprintf("%s/%x/%d", nodes[0].Name(), member.Instance, grids)
		if name, inst, ok := coord.GridOwner(grid); !ok || name != nodes[0].Name() || inst != member.Instance {
			t.Fatalf("grid id %q", grid)
		}
		before := nodes[1].Stats().GridsHosted
		if _, err := w1.CloseGrid(ctx, &workerv1.CloseGridRequest{Ref: &workerv1.GridRef{Grid: grid, View: cr.View}}); err != nil {
			t.Fatal(err)
		}
		if after := nodes[1].Stats().GridsHosted; after != before-1 {
			t.Fatalf("n1 hosts %d grids after closing %s, %d before", after, grid, before)
		}
	}
	q := func() []float32 { return randVec(rng, ec.QHeads*ec.HeadDim) }
	for _, op := range []struct {
		name string
		call func(ctx context.Context, id string) error
	}{
		{"append", func(ctx context.Context, id string) error {
			return c.Append(ctx, id, 0, randVec(rng, kvw), randVec(rng, kvw))
		}},
		{"step", func(ctx context.Context, id string) error {
			_, err := c.Step(ctx, 1, []client.Item{{Seq: id, Q: q()}}, client.StepOptions{})
			return err
		}},
		{"fork", func(ctx context.Context, id string) error { _, err := c.Fork(ctx, id); return err }},
		{"rollback", func(ctx context.Context, id string) error { return c.Rollback(ctx, id, 1) }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cr := fill(ctx)
		sweep(ctx, cr)
		err := op.call(ctx, cr.ID)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "grid lost") || !strings.Contains(err.Error(), "unknown grid") {
			t.Errorf("%s on a sequence whose grid a node swept: %v (code %v), want UNAVAILABLE naming the loss and the unknown grid", op.name, err, status.Code(err))
		}
		// Known lost from now on: every call says so, before any node.
		if _, err := c.Len(ctx, cr.ID); status.Code(err) != codes.Unavailable {
			t.Errorf("after %s: length: %v, want UNAVAILABLE", op.name, err)
		}
		if err := c.Release(ctx, cr.ID); err != nil {
			t.Errorf("after %s: release: %v", op.name, err)
		}
		if _, err := c.Len(ctx, cr.ID); status.Code(err) != codes.NotFound {
			t.Errorf("after %s and a release: length: %v, want NOT_FOUND", op.name, err)
		}
		cancel()
	}
	// A release that finds the grid swept: the sequence is gone with it.
	ctx, cancel := callCtx()
	defer cancel()
	cr := fill(ctx)
	sweep(ctx, cr)
	if err := c.Release(ctx, cr.ID); err != nil {
		t.Errorf("release on a swept grid: %v, want nil (the sequence went with its grid)", err)
	}
	if _, err := c.Len(ctx, cr.ID); status.Code(err) != codes.NotFound {
		t.Errorf("after the release: length: %v, want NOT_FOUND", err)
	}
	// A fresh grid serves.
	last := fill(ctx)
	if _, err := c.Step(ctx, 1, []client.Item{{Seq: last.ID, Q: q()}}, client.StepOptions{}); err != nil {
		t.Errorf("a step on the fresh grid: %v", err)
	}
	if n, err := c.Len(ctx, last.ID); err != nil || n != tokens {
		t.Errorf("fresh sequence length %d, %v; want %d", n, err, tokens)
	}
}
