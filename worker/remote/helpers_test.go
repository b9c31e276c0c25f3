package remote

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// node is one Server on its own grpc.Server and loopback listener, and a
// client connection to it.
type node struct {
	srv  *Server
	gs   *grpc.Server
	conn *grpc.ClientConn
}

// stop stops the node (idempotent).
func (n *node) stop() {
	n.gs.Stop()
	n.srv.Close()
}

// startNodes starts n nodes with cfg (Plaintext is set); cleanup stops
// them.
func startNodes(t testing.TB, n int, cfg ServerConfig) []*node {
	t.Helper()
	var out []*node
	for range n {
		out = append(out, startNode(t, cfg, func(s *Server) workerv1.WorkerServer { return s }))
	}
	return out
}

// startNode starts one node with cfg (Plaintext is set) whose worker API
// is api(its Server); cleanup stops it.
func startNode(t testing.TB, cfg ServerConfig, api func(*Server) workerv1.WorkerServer) *node {
	t.Helper()
	cfg.Plaintext = true
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	workerv1.RegisterWorkerServer(gs, api(srv))
	go gs.Serve(lis) // ends with Stop
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	nd := &node{srv: srv, gs: gs, conn: conn}
	t.Cleanup(func() { conn.Close(); nd.stop() })
	return nd
}

// engineConfig is the small geometry of the tests.
func engineConfig(cp, tp int, mode plan.SelectMode) engine.Config {
	c := engine.DefaultConfig()
	c.Layers, c.QHeads, c.KVHeads, c.HeadDim, c.PageSize = 2, 8, 4, 16, 4
	c.CP, c.TP, c.CapacityPages, c.BlockPages = cp, tp, 256, 2
	c.Policy = plan.Policy{PageSize: 4, BudgetTokens: 16, SinkPages: 1, LocalPages: 1, DenseLayers: 1}
	c.Selection = mode
	c.StepTimeout = 10 * time.Second
	c.MemoryLimit = memlimit.NoLimit
	return c
}

// workerConfig is the worker config of an engine config.
func workerConfig(c engine.Config) worker.Config {
	return worker.Config{
		Layers:      c.Layers,
		Geometry:    plan.Geometry{QHeads: c.QHeads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: c.PageSize, DType: c.DType},
		CP:          c.CP,
		TP:          c.TP,
		Capacity:    c.CapacityPages,
		Policy:      c.Policy,
		Mode:        c.Selection,
		MemoryLimit: memlimit.NoLimit,
	}
}

// spread puts rank (tp, cp) on node (tp*CP+cp+offset) mod len(conns);
// nodes without ranks are left out.
func spread(c engine.Config, conns []grpc.ClientConnInterface, offset int) []NodeRanks {
	nodes := make([]NodeRanks, len(conns))
	for tp := range c.TP {
		for cp := range c.CP {
			i := (tp*c.CP + cp + offset) % len(conns)
			nodes[i].Conn = conns[i]
			nodes[i].Ranks = append(nodes[i].Ranks, worker.Rank{TP: tp, CP: cp})
		}
	}
	var out []NodeRanks
	for _, n := range nodes {
		if n.Conn != nil {
			out = append(out, n)
		}
	}
	return out
}

func conns(nodes []*node) []grpc.ClientConnInterface {
	var out []grpc.ClientConnInterface
	for _, n := range nodes {
		out = append(out, n.conn)
	}
	return out
}

// openRemote opens grid id over the given nodes and an engine over it;
// cleanup closes both.
func openRemote(t testing.TB, c engine.Config, nodes []NodeRanks, id string) (*engine.Engine, []*Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref := GridRef{Grid: id, View: 1}
	clients, err := OpenGrid(ctx, nodes, ref, workerConfig(c))
	if err != nil {
		t.Fatalf("open grid: %v", err)
	}
	hosts := make([]engine.Host, len(nodes))
	for i, n := range nodes {
		hosts[i] = engine.Host{Worker: clients[i], Ranks: n.Ranks}
	}
	e, err := engine.Open(c, hosts)
	if err != nil {
		t.Fatalf("engine.Open: %v", err)
	}
	t.Cleanup(func() {
		e.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = CloseGrid(ctx, clients...) // stopped nodes fail; that is fine
	})
	return e, clients
}

func randVec(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// twin applies the same operations to an in-process engine (ref) and a
// remote one (rem) and compares every result.
type twin struct {
	t         *testing.T
	c         engine.Config
	ref, rem  *engine.Engine
	rng       *rand.Rand
	maxRel    float64
	compared  int
	identical bool
}

func (w *twin) create(p plan.Placement) engine.SeqID {
	w.t.Helper()
	a, err1 := w.ref.Create(p)
	b, err2 := w.rem.Create(p)
	if err1 != nil || err2 != nil || a != b {
		w.t.Fatalf("create: in process %d, %v; remote %d, %v", a, err1, b, err2)
	}
	return a
}

func (w *twin) append(id engine.SeqID, layer, n int) {
	w.t.Helper()
	tok := w.c.KVHeads * w.c.HeadDim
	k, v := randVec(w.rng, n*tok), randVec(w.rng, n*tok)
	if err := w.ref.Append(id, layer, k, v); err != nil {
		w.t.Fatalf("append in process: %v", err)
	}
	if err := w.rem.Append(id, layer, k, v); err != nil {
		w.t.Fatalf("append remote: %v", err)
	}
}

// fill appends n tokens to every layer of id in random chunks.
func (w *twin) fill(id engine.SeqID, n int) {
	for layer := range w.c.Layers {
		for left := n; left > 0; {
			k := min(left, 1+w.rng.IntN(n))
			w.append(id, layer, k)
			left -= k
		}
	}
}

// decode runs one token's steps over every layer for ids (a new token
// each when fresh), with random budgets.
func (w *twin) decode(ids []engine.SeqID, fresh bool, opt engine.StepOptions) {
	w.t.Helper()
	c := w.c
	for layer := range c.Layers {
		var reqs []engine.Request
		for _, id := range ids {
			r := engine.Request{Seq: id, Q: randVec(w.rng, c.QHeads*c.HeadDim), BudgetTokens: []int{0, 8, 12}[w.rng.IntN(3)]}
			if fresh {
				r.K, r.V = randVec(w.rng, c.KVHeads*c.HeadDim), randVec(w.rng, c.KVHeads*c.HeadDim)
			}
			reqs = append(reqs, r)
		}
		var a, b engine.Result
		if err := w.ref.Step(context.Background(), layer, reqs, opt, &a); err != nil {
			w.t.Fatalf("step in process: %v", err)
		}
		if err := w.rem.Step(context.Background(), layer, reqs, opt, &b); err != nil {
			w.t.Fatalf("step remote: %v", err)
		}
		w.same("o", a.O, b.O)
		w.same("lse", a.LSE, b.LSE)
		if fmt.Sprint(a.Plans) != fmt.Sprint(b.Plans) {
			w.t.Fatalf("layer %d: plans differ: %v vs %v", layer, a.Plans, b.Plans)
		}
		if opt.Diagnostics {
			w.same("dense lse", a.DenseLSE, b.DenseLSE)
			for i := range a.Diag {
				if fmt.Sprint(a.Diag[i].Selected) != fmt.Sprint(b.Diag[i].Selected) {
					w.t.Fatalf("layer %d seq %d: selected pages differ:\n%v\n%v", layer, ids[i], a.Diag[i].Selected, b.Diag[i].Selected)
				}
				for h := range a.Diag[i].Scores {
					w.same("scores", a.Diag[i].Scores[h], b.Diag[i].Scores[h])
				}
				w.sameF("rel l2", a.Diag[i].RelL2, b.Diag[i].RelL2)
			}
		}
	}
}

func (w *twin) sameF(what string, a, b float64) {
	w.t.Helper()
	if a != b && math.Abs(a-b) > 1e-5*math.Max(math.Abs(a), math.Abs(b))+1e-7 {
		w.t.Fatalf("%s: %v vs %v", what, a, b)
	}
}

// same compares a and b within 1e-5 relative (plus 1e-7 absolute for
// values near 0), recording the largest relative difference.
func (w *twin) same(what string, a, b []float32) {
	w.t.Helper()
	if len(a) != len(b) {
		w.t.Fatalf("%s: %d vs %d values", what, len(a), len(b))
	}
	for i := range a {
		x, y := float64(a[i]), float64(b[i])
		w.compared++
		if a[i] == b[i] || (math.IsInf(x, 0) && x == y) {
			continue
		}
		w.identical = false
		d := math.Abs(x - y)
		if m := math.Max(math.Abs(x), math.Abs(y)); m > 0 {
			w.maxRel = math.Max(w.maxRel, d/m)
		}
		if !(d <= 1e-5*math.Max(math.Abs(x), math.Abs(y))+1e-7) {
			w.t.Fatalf("%s[%d]: in process %v, remote %v", what, i, a[i], b[i])
		}
	}
}

func (w *twin) fork(id engine.SeqID) engine.SeqID {
	w.t.Helper()
	a, err1 := w.ref.Fork(id)
	b, err2 := w.rem.Fork(id)
	if err1 != nil || err2 != nil || a != b {
		w.t.Fatalf("fork: in process %d, %v; remote %d, %v", a, err1, b, err2)
	}
	return a
}

func (w *twin) rollback(id engine.SeqID, n int) {
	w.t.Helper()
	if err := w.ref.Rollback(id, n); err != nil {
		w.t.Fatalf("rollback in process: %v", err)
	}
	if err := w.rem.Rollback(id, n); err != nil {
		w.t.Fatalf("rollback remote: %v", err)
	}
}

func (w *twin) release(id engine.SeqID) {
	w.t.Helper()
	if err := w.ref.Release(id); err != nil {
		w.t.Fatalf("release in process: %v", err)
	}
	if err := w.rem.Release(id); err != nil {
		w.t.Fatalf("release remote: %v", err)
	}
}

func (w *twin) sameLen(ids ...engine.SeqID) {
	w.t.Helper()
	for _, id := range ids {
		a, err1 := w.ref.Len(id)
		b, err2 := w.rem.Len(id)
		if err1 != nil || err2 != nil || a != b {
			w.t.Fatalf("len %d: in process %d, %v; remote %d, %v", id, a, err1, b, err2)
		}
	}
}
