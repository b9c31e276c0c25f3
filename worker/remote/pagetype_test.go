package remote

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// TestConfigDTypeRoundTrip: the pages' storage type travels as
// GridConfig.kv_dtype, f32 as "" (what a node older than the field
// reads) and fp8 as "fp8"; the GPU's 16-bit types do not travel, and a
// node refuses a kv_dtype it does not know rather than store f32.
func TestConfigDTypeRoundTrip(t *testing.T) {
	for dt, wire := range map[plan.DType]string{plan.Float32: "", plan.FP8: "fp8"} {
		c := workerConfig(engineConfig(2, 1, plan.Exact))
		c.DType = dt
		g, err := encodeConfig(c)
		if err != nil {
			t.Fatal(err)
		}
		if g.KvDtype != wire {
			t.Errorf("%v travels as kv_dtype %q, want %q", dt, g.KvDtype, wire)
		}
		back, err := decodeConfig(g)
		if err != nil || back.DType != dt {
			t.Errorf("%v: decoded %v, %v", dt, back.DType, err)
		}
	}
	for _, dt := range []plan.DType{plan.BFloat16, plan.Float16} {
		c := workerConfig(engineConfig(1, 1, plan.Exact))
		c.DType = dt
		if _, err := encodeConfig(c); !errors.Is(err, worker.ErrBadMessage) || !strings.Contains(err.Error(), "does not travel") {
			t.Errorf("%v: %v", dt, err)
		}
	}
	g, err := encodeConfig(workerConfig(engineConfig(1, 1, plan.Exact)))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"fp4", "bf16", "f32", "FP8"} {
		g.KvDtype = s
		if _, err := decodeConfig(g); !errors.Is(err, worker.ErrBadMessage) || !strings.Contains(err.Error(), `"`+s+`"`) {
			t.Errorf("kv_dtype %q: %v", s, err)
		}
	}
}

// TestOpenGridPageType: a node refuses to open a grid of an unknown
// kv_dtype (InvalidArgument, nothing reserved); an fp8 grid opens on
// nodes that store fp8 (their grids' configs say so and their replies
// name it); and an fp8 grid is refused, and closed on every node that
// opened it, when a node answers as a node older than the field does
// (it ignored kv_dtype: stores f32, names no type).
func TestOpenGridPageType(t *testing.T) {
	nodes := startNodes(t, 2, DefaultServerConfig())
	c := engineConfig(2, 1, plan.Exact)
	c.DType = plan.FP8
	wc := workerConfig(c)
	gc, err := encodeConfig(wc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	bad := proto.Clone(gc).(*workerv1.GridConfig)
	bad.KvDtype = "fp4"
	_, err = workerv1.NewWorkerClient(nodes[0].conn).OpenGrid(ctx, &workerv1.OpenGridRequest{
		Ref: &workerv1.GridRef{Grid: "fp4", View: 1}, Config: bad, Ranks: []*workerv1.Rank{{}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `kv dtype "fp4"`) {
		t.Errorf("kv_dtype fp4: %v", err)
	}
	if g := nodes[0].srv.Grids(); g != 0 {
		t.Errorf("a refused grid left %d grids", g)
	}

	clients, err := OpenGrid(ctx, spread(c, conns(nodes), 0), GridRef{Grid: "fp8", View: 1}, wc)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		n.srv.mu.Lock()
		dt := n.srv.grids["fp8"].cfg.DType
		n.srv.mu.Unlock()
		if dt != plan.FP8 {
			t.Errorf("node %d hosts the fp8 grid's ranks as %v", i, dt)
		}
	}
	if err := CloseGrid(ctx, clients...); err != nil {
		t.Fatal(err)
	}

	old := startNode(t, DefaultServerConfig(), func(s *Server) workerv1.WorkerServer { return oldWorker{s} })
	mixed := []NodeRanks{{Conn: nodes[0].conn, Ranks: []worker.Rank{{CP: 0}}}, {Conn: old.conn, Ranks: []worker.Rank{{CP: 1}}}}
	_, err = OpenGrid(ctx, mixed, GridRef{Grid: "mixed", View: 1}, wc)
	if !errors.Is(err, ErrPageType) || !strings.Contains(err.Error(), "the node stores f32") {
		t.Fatalf("fp8 grid with an old node: %v", err)
	}
	for i, n := range []*node{nodes[0], old} {
		if g := n.srv.Grids(); g != 0 {
			t.Errorf("node %d holds %d grids after the refused open", i, g)
		}
	}
	// An f32 grid opens on the old node as before.
	wc.DType = plan.Float32
	clients, err = OpenGrid(ctx, mixed, GridRef{Grid: "f32", View: 1}, wc)
	if err != nil {
		t.Fatal(err)
	}
	if err := CloseGrid(ctx, clients...); err != nil {
		t.Fatal(err)
	}
}

// oldWorker is a worker API as a node older than GridConfig.kv_dtype
// serves it: the field is dropped on the way in (an unknown field) and
// the reply names no type.
type oldWorker struct{ *Server }

func (o oldWorker) OpenGrid(ctx context.Context, r *workerv1.OpenGridRequest) (*workerv1.OpenGridReply, error) {
	if r.Config != nil {
		cfg := proto.Clone(r.Config).(*workerv1.GridConfig)
		cfg.KvDtype = ""
		r.Config = cfg
	}
	rep, err := o.Server.OpenGrid(ctx, r)
	if rep != nil {
		rep.KvDtype = ""
	}
	return rep, err
}

// slotDevice is a device-resident node's backend as pageType sees it:
// a kernels.SlotStore of pools of one type.
type slotDevice struct {
	kernels.Backend
	kernels.SlotStore
	dt plan.DType
}

func (d slotDevice) Name() string { return "slot device" }

func (d slotDevice) PoolDType() plan.DType { return d.dt }

// TestPageTypeDeviceResident: a device-resident node stores its
// devices' type: an fp8 grid opens only where every device holds fp8
// pools (refused, naming both types, on bf16 devices), and an f32 grid
// takes the devices' type (fp8 pools hold fp8 records; bf16 and f16
// pages on a GPU keep the f32 config, as before the field).
func TestPageTypeDeviceResident(t *testing.T) {
	srv := func(dts ...plan.DType) *Server {
		s := &Server{cfg: ServerConfig{DeviceResident: true}}
		for _, dt := range dts {
			s.bes = append(s.bes, slotDevice{dt: dt})
		}
		return s
	}
	for _, tc := range []struct {
		devs       []plan.DType
		want, have plan.DType
		err        string
	}{
		{[]plan.DType{plan.FP8}, plan.FP8, plan.FP8, ""},
		{[]plan.DType{plan.FP8, plan.FP8}, plan.Float32, plan.FP8, ""},
		{[]plan.DType{plan.BFloat16}, plan.Float32, plan.Float32, ""},
		{[]plan.DType{plan.BFloat16}, plan.FP8, 0, "grid asks for fp8 pages; this node's devices store bf16"},
		{[]plan.DType{plan.FP8, plan.BFloat16}, plan.FP8, 0, "this node's devices store f32"},
	} {
		got, err := srv(tc.devs...).pageType(tc.want)
		switch {
		case tc.err != "" && (!errors.Is(err, worker.ErrBadMessage) || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v asked on %v devices: %v, want %q", tc.want, tc.devs, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.have):
			t.Errorf("%v asked on %v devices: %v, %v; want %v", tc.want, tc.devs, got, err, tc.have)
		}
	}
	if got, err := (&Server{}).pageType(plan.FP8); err != nil || got != plan.FP8 {
		t.Errorf("host pools: %v, %v", got, err)
	}
}

// TestEquivalenceFP8 runs a workload on an engine of fp8 pages over two
// nodes' Servers (the grid's kv_dtype fp8) and on an in-process engine
// of fp8 pages: the outputs agree as TestEquivalence's do, so the
// workers store and attend the same fp8 records.
func TestEquivalenceFP8(t *testing.T) {
	nodes := startNodes(t, 2, DefaultServerConfig())
	c := engineConfig(2, 2, plan.Union)
	c.DType = plan.FP8
	ref, err := engine.New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	rem, _ := openRemote(t, c, spread(c, conns(nodes), 1), "eq-fp8")
	w := &twin{t: t, c: c, ref: ref, rem: rem, rng: rand.New(rand.NewPCG(3, 7)), identical: true}
	a := w.create(plan.Striped)
	w.fill(a, 200)
	for range 3 {
		w.decode([]engine.SeqID{a}, true, engine.StepOptions{})
	}
	w.rollback(a, 5)
	w.decode([]engine.SeqID{a}, true, engine.StepOptions{})
	t.Logf("%d values compared, bit-identical %v (largest relative difference %.3g)", w.compared, w.identical, w.maxRel)
}
