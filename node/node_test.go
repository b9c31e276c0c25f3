package node_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// memberlist's goroutines end a probe interval after Shutdown: give them
// time before goleak's verdict.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("time.Sleep"))
}

// geometry is a small model for the cluster tests.
func geometry(cp, tp int, mode plan.SelectMode) engine.Config { return nodetest.Geometry(cp, tp, mode) }

// startCluster starts n nodes n0.. (nodetest.Start).
func startCluster(t *testing.T, n int, ec engine.Config) []*node.Node {
	t.Helper()
	return nodetest.Start(t, "n", n, ec, nil)
}

func dial(t *testing.T, nd *node.Node) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, nd.Addr(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// A sharded decode through a 3-node cluster (real memberlist and gRPC on
// loopback) equals the in-process engine on the same data: every layout
// of CP 1-4 x TP 1-2 that fits, every selection mode, sequences created
// through different nodes (so that calls are forwarded), steps with and
// without new tokens, a fork.
func TestClusterEqualsInProcess(t *testing.T) {
	layouts := [][2]int{{1, 1}, {2, 1}, {3, 2}, {4, 1}, {2, 2}}
	modes := []plan.SelectMode{plan.Exact, plan.Union, plan.Replicated}
	if testing.Short() {
		layouts = layouts[1:3]
	}
	for li, lo := range layouts {
		for mi, mode := range modes {
			t.Run(fmt.Sprintf("cp%d_tp%d_%v", lo[0], lo[1], mode), func(t *testing.T) {
				ec := geometry(lo[0], lo[1], mode)
				nodes := startCluster(t, 3, ec)
				ref, err := engine.New(ec)
				if err != nil {
					t.Fatal(err)
				}
				defer ref.Close()
				rng := rand.New(rand.NewPCG(uint64(li), uint64(mi)))
				ctx := t.Context()
				kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
				// Sequence i is created through node i and driven
				// through node (i+1) % 3 (forwarded).
				type pair struct {
					id  string
					rid engine.SeqID
					via *client.Client
				}
				var seqs []pair
				for i := range 3 {
					id, nodesOf, err := dial(t, nodes[i]).Create(ctx, plan.Striped)
					if err != nil {
						t.Fatal(err)
					}
					if len(nodesOf) != ec.CP*ec.TP {
						t.Fatalf("create: %d nodes for %d ranks", len(nodesOf), ec.CP*ec.TP)
					}
					rid, err := ref.Create(plan.Striped)
					if err != nil {
						t.Fatal(err)
					}
					seqs = append(seqs, pair{id, rid, dial(t, nodes[(i+1)%3])})
				}
				for _, s := range seqs {
					n := 20 + rng.IntN(60)
					for l := range ec.Layers {
						k, v := randVec(rng, n*kv), randVec(rng, n*kv)
						if err := s.via.Append(ctx, s.id, l, k, v); err != nil {
							t.Fatal(err)
						}
						if err := ref.Append(s.rid, l, k, v); err != nil {
							t.Fatal(err)
						}
					}
				}
				child, err := seqs[0].via.Fork(ctx, seqs[0].id)
				if err != nil {
					t.Fatal(err)
				}
				rchild, err := ref.Fork(seqs[0].rid)
				if err != nil {
					t.Fatal(err)
				}
				seqs = append(seqs, pair{child, rchild, seqs[0].via})
				for step := range 3 {
					for _, s := range seqs {
						for l := range ec.Layers {
							q := randVec(rng, qd)
							var k, v []float32
							if step != 1 {
								k, v = randVec(rng, kv), randVec(rng, kv)
							}
							got, err := s.via.Step(ctx, l, []client.Item{{Seq: s.id, Q: q, K: k, V: v}}, client.StepOptions{})
							if err != nil {
								t.Fatal(err)
							}
							var want engine.Result
							if err := ref.Step(ctx, l, []engine.Request{{Seq: s.rid, Q: q, K: k, V: v}}, engine.StepOptions{}, &want); err != nil {
								t.Fatal(err)
							}
							for i := range want.O {
								if d := math.Abs(float64(got.O[i] - want.O[i])); d > 1e-5*(1+math.Abs(float64(want.O[i]))) {
									t.Fatalf("%s step %d layer %d: o[%d] = %g, in process %g", s.id, step, l, i, got.O[i], want.O[i])
								}
							}
							if got.Plans[0] != want.Plans[0] {
								t.Fatalf("plan %+v, in process %+v", got.Plans[0], want.Plans[0])
							}
						}
					}
				}
				for _, s := range seqs {
					n, err := s.via.Len(ctx, s.id)
					m, _ := ref.Len(s.rid)
					if err != nil || n != m {
						t.Fatalf("%s: length %d (%v), in process %d", s.id, n, err, m)
					}
					if err := s.via.Release(ctx, s.id); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// A node killed mid-use fails the steps of the sequences it hosts with
// UNAVAILABLE within the step deadline, on every node they are sent to;
// sequences not placed on it keep decoding; once memberlist declares it
// dead, new sequences are placed on the survivors.
func TestClusterNodeLoss(t *testing.T) {
	ec := geometry(2, 1, plan.Exact)
	nodes := startCluster(t, 3, ec)
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(1, 2))
	kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
	type seq struct {
		id    string
		nodes []string
		c     *client.Client
	}
	// A sequence created through every node.
	var seqs []seq
	for i := range 3 {
		c := dial(t, nodes[i])
		id, on, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq{id, on, c})
		for l := range ec.Layers {
			if err := c.Append(ctx, id, l, randVec(rng, 40*kv), randVec(rng, 40*kv)); err != nil {
				t.Fatal(err)
			}
		}
	}
	uses := func(s seq, name string) bool {
		for _, n := range s.nodes {
			if n == name {
				return true
			}
		}
		return false
	}
	step := func(s seq, via *client.Client) (time.Duration, error) {
		start := time.Now()
		_, err := via.Step(ctx, 1, []client.Item{{Seq: s.id, Q: randVec(rng, qd), K: randVec(rng, kv), V: randVec(rng, kv)}}, client.StepOptions{})
		return time.Since(start), err
	}
	for _, s := range seqs {
		if _, err := step(s, s.c); err != nil {
			t.Fatal(err)
		}
	}
	// The victim: a node that hosts a rank of a sequence it does not
	// coordinate, while another sequence does not use it (placement is
	// deterministic: the choice is the same at every run).
	var victim *node.Node
	for _, nd := range nodes {
		hit, miss := false, false
		for _, s := range seqs {
			hit = hit || (uses(s, nd.Name()) && s.nodes[0] != nd.Name())
			miss = miss || !uses(s, nd.Name())
		}
		if hit && miss {
			victim = nd
			break
		}
	}
	if victim == nil {
		t.Fatalf("no node is used by one sequence and not by another: %v", seqs)
	}
	var alive []*node.Node
	for _, nd := range nodes {
		if nd != victim {
			alive = append(alive, nd)
		}
	}
	victim.Kill()
	survivors := dial(t, alive[0])
	for _, s := range seqs {
		if s.nodes[0] == victim.Name() {
			continue // coordinated by the victim: gone with it
		}
		took, err := step(s, s.c)
		if uses(s, victim.Name()) {
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("%s on %v: step after %s died: %v, want UNAVAILABLE", s.id, s.nodes, victim.Name(), err)
			}
			if took > ec.StepTimeout+time.Second {
				t.Fatalf("%s: the failed step took %v (deadline %v)", s.id, took, ec.StepTimeout)
			}
			// Through another node (forwarded) it fails the same way.
			if _, err := step(s, survivors); status.Code(err) != codes.Unavailable {
				t.Fatalf("%s via %s: %v, want UNAVAILABLE", s.id, alive[0].Name(), err)
			}
		} else if err != nil {
			t.Fatalf("%s on %v does not use %s but failed: %v", s.id, s.nodes, victim.Name(), err)
		}
	}
	nodetest.WaitUp(t, alive, 2)
	for _, nd := range alive {
		c := dial(t, nd)
		id, on, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatalf("create after the loss via %s: %v", nd.Name(), err)
		}
		for _, n := range on {
			if n == victim.Name() {
				t.Fatalf("new sequence %s placed on the dead node: %v", id, on)
			}
		}
		s := seq{id, on, c}
		for l := range ec.Layers {
			if err := c.Append(ctx, id, l, randVec(rng, 10*kv), randVec(rng, 10*kv)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := step(s, c); err != nil {
			t.Fatal(err)
		}
	}
}

// A decode step over every layer through the Steps stream (the plan sent
// to the workers once) equals the in-process engine's Begin, Layer and End, with each
// layer's queries derived from the previous output, through the
// coordinator and through another node (the stream relayed).
func TestClusterDecodeEqualsInProcess(t *testing.T) {
	ec := geometry(2, 2, plan.Exact)
	ec.Layers = 3
	nodes := startCluster(t, 3, ec)
	ref, err := engine.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(5, 6))
	kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
	owner := dial(t, nodes[1])
	id, _, err := owner.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	rid, _ := ref.Create(plan.Striped)
	for l := range ec.Layers {
		k, v := randVec(rng, 50*kv), randVec(rng, 50*kv)
		if err := owner.Append(ctx, id, l, k, v); err != nil {
			t.Fatal(err)
		}
		if err := ref.Append(rid, l, k, v); err != nil {
			t.Fatal(err)
		}
	}
	derive := func(o []float32, l int) (q, k, v []float32) {
		q, k, v = make([]float32, qd), make([]float32, kv), make([]float32, kv)
		for j := range q {
			q[j] = 2*o[j] + float32(l)
		}
		for j := range k {
			k[j], v[j] = o[j]-float32(l), o[(j+3)%qd]
		}
		return
	}
	for step, via := range []*client.Client{owner, dial(t, nodes[2]), owner} {
		q, k, v := randVec(rng, qd), randVec(rng, kv), randVec(rng, kv)
		var want [][]float32
		reqs := []engine.Request{{Seq: rid, Q: q, K: k, V: v}}
		last, err := decodeLayers(ctx, ref, ec.Layers, reqs, func(l int, rq []engine.Request, o []float32) {
			want = append(want, append([]float32(nil), o...))
			rq[0].Q, rq[0].K, rq[0].V = derive(o, l)
		})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, last)
		var got [][]float32
		res, err := via.Decode(ctx, 0, ec.Layers, []client.Item{{Seq: id, Q: q, K: k, V: v}}, client.StepOptions{}, func(l int, items []client.Item, r *client.StepResult) error {
			got = append(got, r.O)
			items[0].Q, items[0].K, items[0].V = derive(r.O, l)
			return nil
		})
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		got = append(got, res.O)
		for l := range want {
			for j := range want[l] {
				if d := math.Abs(float64(got[l][j] - want[l][j])); d > 1e-5*(1+math.Abs(float64(want[l][j]))) {
					t.Fatalf("step %d layer %d: o[%d] = %g, in process %g", step, l, j, got[l][j], want[l][j])
				}
			}
		}
	}
	if n, err := owner.Len(ctx, id); err != nil || n != 53 {
		t.Fatalf("length %d (%v), want 53", n, err)
	}
}
