package node_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/coord"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// recorder collects the StepStats a node observes.
type recorder struct {
	mu sync.Mutex
	st []coord.StepStats
}

func (r *recorder) observe(s coord.StepStats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.st = append(r.st, s)
}

// take returns the stats observed since the last take.
func (r *recorder) take() []coord.StepStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.st
	r.st = nil
	return st
}

// pagesOf is what StepStats counts of plans: reads and pages x KV heads.
func pagesOf(kv int, plans ...[]plan.Plan) (read, total int64) {
	for _, ps := range plans {
		for _, p := range ps {
			read += int64(p.Reads() * kv)
			total += int64(p.Pages * kv)
		}
	}
	return read, total
}

// TestObserveAndStats: the coordinator of a step observes it once
// (kind, items, layers, pages read vs dense, phase times, code), failed
// steps included and forwarded ones on the coordinator only; Node.Stats
// counts the sequences, grids coordinated and hosted, pages and members.
func TestObserveAndStats(t *testing.T) {
	ec := geometry(2, 1, plan.Exact)
	recs := []*recorder{{}, {}}
	nodes := nodetest.Start(t, "o", 2, ec, func(i int, c *node.Config) { c.Observe = recs[i].observe })
	for i, nd := range nodes {
		s := nd.Stats()
		want := node.Stats{MembersUp: 2, PagesFree: 8 * ec.CapacityPages, Serving: true}
		if s != want {
			t.Errorf("node %d before any sequence: %+v, want %+v", i, s, want)
		}
	}
	ctx := t.Context()
	c0, c1 := dial(t, nodes[0]), dial(t, nodes[1])
	rng := rand.New(rand.NewPCG(3, 4))
	kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
	var seqs []string
	for range 2 {
		id, _, err := c0.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		for l := range ec.Layers {
			if err := c0.Append(ctx, id, l, randVec(rng, 50*kv), randVec(rng, 50*kv)); err != nil {
				t.Fatal(err)
			}
		}
		seqs = append(seqs, id)
	}
	s0, s1 := nodes[0].Stats(), nodes[1].Stats()
	if s0.Sequences != 2 || s0.GridsCoordinated != 1 || s0.GridsHosted != 1 || s1.Sequences != 0 || s1.GridsCoordinated != 0 || s1.GridsHosted != 1 {
		t.Errorf("stats with one grid of 2 sequences over both nodes: node 0 %+v, node 1 %+v", s0, s1)
	}
	for i, s := range []node.Stats{s0, s1} {
		if s.PagesUsed <= 0 || s.PagesUsed+s.PagesFree != 8*ec.CapacityPages {
			t.Errorf("node %d pages used %d, free %d", i, s.PagesUsed, s.PagesFree)
		}
	}

	// A Step through the coordinator, and one forwarded by node 1.
	for _, c := range []*client.Client{c0, c1} {
		items := []client.Item{{Seq: seqs[0], Q: randVec(rng, qd), K: randVec(rng, kv), V: randVec(rng, kv)}, {Seq: seqs[1], Q: randVec(rng, qd)}}
		res, err := c.Step(ctx, 1, items, client.StepOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := recs[0].take()
		if len(got) != 1 {
			t.Fatalf("coordinator observed %d stats for one step", len(got))
		}
		s := got[0]
		read, total := pagesOf(ec.KVHeads, res.Plans)
		if s.Kind != "step" || s.Items != 2 || s.Layers != 1 || s.Err != nil || s.Code != codes.OK ||
			s.PagesRead != read || s.PagesTotal != total || s.Time.Total <= 0 || s.Time.Attend <= 0 {
			t.Errorf("step stats %+v, want step of 2 items, 1 layer, OK, pages %d of %d", s, read, total)
		}
		if read >= total {
			t.Errorf("layer 1 read %d of %d pages: want a sparse layer", read, total)
		}
		if len(s.PeerErrors) != 0 {
			t.Errorf("a step that succeeded blames %v", s.PeerErrors)
		}
		if n := len(recs[1].take()); n != 0 {
			t.Errorf("the forwarding node observed %d stats", n)
		}
	}

	// A Decode of both layers.
	var layer0 []plan.Plan
	res, err := c0.Decode(ctx, 0, 2, []client.Item{{Seq: seqs[1], Q: randVec(rng, qd)}}, client.StepOptions{},
		func(layer int, items []client.Item, r *client.StepResult) error {
			layer0 = append([]plan.Plan(nil), r.Plans...)
			items[0].Q = randVec(rng, qd)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	got := recs[0].take()
	read, total := pagesOf(ec.KVHeads, layer0, res.Plans)
	if len(got) != 1 || got[0].Kind != "steps" || got[0].Items != 1 || got[0].Layers != 2 || got[0].Code != codes.OK ||
		got[0].PagesRead != read || got[0].PagesTotal != total || got[0].Time.Total <= 0 {
		t.Errorf("decode stats %+v, want steps of 1 item, 2 layers, OK, pages %d of %d", got, read, total)
	}

	// A step that fails in the coordinator: NOT_FOUND, nothing read.
	inst, _, _ := strings.Cut(seqs[0], ".")
	if _, err := c0.Step(ctx, 1, []client.Item{{Seq: seqs[0], Q: randVec(rng, qd)}, {Seq: inst + ".999", Q: randVec(rng, qd)}}, client.StepOptions{}); err == nil {
		t.Fatal("a step with an unknown sequence succeeded")
	}
	got = recs[0].take()
	if len(got) != 1 || got[0].Kind != "step" || got[0].Code != codes.NotFound || !errors.Is(got[0].Err, coord.ErrUnknownSequence) ||
		got[0].Layers != 0 || got[0].PagesRead != 0 || len(got[0].PeerErrors) != 0 {
		t.Errorf("failed step stats %+v, want one NotFound", got)
	}

	for _, id := range seqs {
		if err := c0.Release(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if s := nodes[0].Stats(); s.Sequences != 0 {
		t.Errorf("stats after release: %+v", s)
	}
}

// TestObservePeerErrors: a decode whose grid lost a node (killed) is
// observed with that node, and only it, in PeerErrors (unavailable); a
// later step on the lost grid fails before it reaches a node and blames
// nobody. (cmd/questd's TestServeMetricsPeerFailure does a Step.)
func TestObservePeerErrors(t *testing.T) {
	ec := geometry(3, 1, plan.Exact)
	rec := &recorder{}
	// Slow failure detection: the steps after the kill reach the dead
	// node before the membership declares it dead.
	nodes := nodetest.Start(t, "pe", 3, ec, func(i int, c *node.Config) {
		c.Member.ProbeInterval, c.Member.ProbeTimeout, c.Member.SuspicionMult = time.Second, 500*time.Millisecond, 4
		if i == 0 {
			c.Observe = rec.observe
		}
	})
	ctx := t.Context()
	c := dial(t, nodes[0])
	rng := rand.New(rand.NewPCG(5, 6))
	kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
	var seqs []string
	for range 2 {
		id, on, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		if len(on) != 3 || on[0] != "pe0" {
			t.Fatalf("placed on %v, want the three nodes, pe0 first", on)
		}
		for l := range ec.Layers {
			if err := c.Append(ctx, id, l, randVec(rng, 50*kv), randVec(rng, 50*kv)); err != nil {
				t.Fatal(err)
			}
		}
		seqs = append(seqs, id)
	}
	if _, err := c.Step(ctx, 1, []client.Item{{Seq: seqs[0], Q: randVec(rng, qd)}}, client.StepOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.take()

	nodes[2].Kill()
	want := []coord.PeerError{{Node: "pe2", Kind: coord.PeerUnavailable}}
	_, err := c.Decode(ctx, 0, 2, []client.Item{{Seq: seqs[0], Q: randVec(rng, qd)}}, client.StepOptions{},
		func(_ int, items []client.Item, _ *client.StepResult) error {
			items[0].Q = randVec(rng, qd)
			return nil
		})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("decode after pe2 died: %v, want UNAVAILABLE", err)
	}
	if got := rec.take(); len(got) != 1 || got[0].Kind != "steps" || !slices.Equal(got[0].PeerErrors, want) {
		t.Errorf("decode after pe2 died observed %+v, want PeerErrors %v", got, want)
	}
	// The grid is lost: the other sequence's step fails before it
	// reaches a node, and blames nobody.
	if _, err := c.Step(ctx, 1, []client.Item{{Seq: seqs[1], Q: randVec(rng, qd)}}, client.StepOptions{}); err == nil {
		t.Fatal("a step on the lost grid succeeded")
	}
	for _, s := range rec.take() { // the service may refuse it before the coordinator's Step
		if len(s.PeerErrors) != 0 {
			t.Errorf("step on the lost grid observed %+v, want no PeerErrors", s)
		}
	}
}

// TestHealthDrain: the gRPC health service says SERVING once Start
// returned, and NOT_SERVING from the start of Stop (a Watch sees it
// before the server stops); Serving and Stats follow.
func TestHealthDrain(t *testing.T) {
	nodes := nodetest.Start(t, "h", 1, geometry(1, 1, plan.Exact), nil)
	nd := nodes[0]
	cc, err := grpc.NewClient(nd.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, svc := range []string{"", "questrt.decode.v1.Decode", "questrt.worker.v1.Worker"} {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q after Start: %v, %v", svc, r.GetStatus(), err)
		}
	}
	if !nd.Serving() || !nd.Stats().Serving {
		t.Error("not Serving after Start")
	}
	wctx, wcancel := context.WithCancel(ctx)
	w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v, %v", r.GetStatus(), err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- nd.Stop(ctx) }()
	r, err := w.Recv()
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("watch during the drain: %v, %v", r.GetStatus(), err)
	}
	if nd.Serving() {
		t.Error("Serving during the drain")
	}
	wcancel() // the drain waits for the watch
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if s := nd.Stats(); s.Serving || s.Sequences != 0 {
		t.Errorf("stats after Stop: %+v", s)
	}
}
