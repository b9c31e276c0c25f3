package remote

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// TestStatusRoundTrip maps each sentinel (and a join of two) to a status
// and back: the code is the documented one, and the rebuilt error
// errors.Is every sentinel the original wrapped.
func TestStatusRoundTrip(t *testing.T) {
	cases := []struct {
		err  error
		code codes.Code
		is   []error
	}{
		{fmt.Errorf("x: %w", worker.ErrBadMessage), codes.InvalidArgument, nil},
		{fmt.Errorf("x: %w", worker.ErrNotHosted), codes.InvalidArgument, nil},
		{fmt.Errorf("x: %w", worker.ErrUnknownSequence), codes.NotFound, nil},
		{fmt.Errorf("x: %w", worker.ErrStep), codes.FailedPrecondition, nil},
		{fmt.Errorf("x: %w", worker.ErrStepOpen), codes.FailedPrecondition, nil},
		{fmt.Errorf("x: %w", pagestore.ErrPoolExhausted), codes.ResourceExhausted, nil},
		{fmt.Errorf("x: %w", memlimit.ErrTooLarge), codes.ResourceExhausted, nil},
		{fmt.Errorf("x: %w", collective.ErrPeerClosed), codes.Unavailable, []error{ErrUnavailable}},
		{fmt.Errorf("x: %w", collective.ErrAborted), codes.Unavailable, []error{ErrUnavailable}},
		{fmt.Errorf("x: %w", collective.ErrClosed), codes.Unavailable, []error{ErrUnavailable}},
		{fmt.Errorf("x: %w", worker.ErrClosed), codes.Unavailable, []error{ErrUnavailable}},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded, nil},
		{fmt.Errorf("x: %w", context.Canceled), codes.Canceled, nil},
		{fmt.Errorf("x: %w", worker.ErrChanged), codes.Internal, nil},
		{fmt.Errorf("x: %w: page 3: %w", pagestore.ErrDamaged, tier.ErrCorrupt), codes.DataLoss, []error{pagestore.ErrDamaged}},
		{fmt.Errorf("append: %w: %w", worker.ErrChanged, pagestore.ErrPoolExhausted), codes.ResourceExhausted, nil},
		{errors.New("something else"), codes.Internal, nil},
	}
	for _, tc := range cases {
		st := ToStatus(tc.err)
		if st.Code() != tc.code || st.Message() != tc.err.Error() {
			t.Errorf("%v: status %v %q, want %v", tc.err, st.Code(), st.Message(), tc.code)
		}
		back := FromStatus(st.Err())
		for _, r := range reasons {
			if r.err != ErrUnavailable && errors.Is(tc.err, r.err) != errors.Is(back, r.err) {
				t.Errorf("%v: rebuilt %v: errors.Is(%v) = %v", tc.err, back, r.err, errors.Is(back, r.err))
			}
		}
		for _, s := range tc.is {
			if !errors.Is(back, s) {
				t.Errorf("%v: rebuilt error does not wrap %v", tc.err, s)
			}
		}
		if status.Code(back) != tc.code || !strings.Contains(back.Error(), tc.err.Error()) {
			t.Errorf("%v: rebuilt %v has code %v", tc.err, back, status.Code(back))
		}
	}
	if FromStatus(nil) != nil || ToStatus(nil).Code() != codes.OK {
		t.Error("nil is not OK")
	}
	if err := FromStatus(errors.New("dial: refused")); !errors.Is(err, ErrUnavailable) {
		t.Errorf("a non-status error is not unavailable: %v", err)
	}
}

func TestConfigRoundTrip(t *testing.T) {
	c := workerConfig(engineConfig(3, 2, plan.Union))
	c.Policy.GQA, c.Policy.Selector = plan.PerHead, plan.Oracle
	c.Policy.LayerBudget = map[int]int{1: 32}
	c.MemoryLimit = 0
	g, err := encodeConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeConfig(g)
	if err != nil || !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip: %+v, %v\nwant %+v", back, err, c)
	}
	g.Mode = "sideways"
	if _, err := decodeConfig(g); !errors.Is(err, worker.ErrBadMessage) || !strings.Contains(err.Error(), `"sideways"`) {
		t.Errorf("unknown mode: %v", err)
	}
	c.Capacity = -1
	if _, err := encodeConfig(c); !errors.Is(err, worker.ErrBadMessage) {
		t.Errorf("negative capacity: %v", err)
	}
}

// TestConfigOffloadRoundTrip carries the offload settings both ways
// (GridConfigProto and GridConfigFromProto, which validates) and refuses
// an unknown eviction policy and out-of-range counts, naming the field.
func TestConfigOffloadRoundTrip(t *testing.T) {
	c := workerConfig(engineConfig(2, 1, plan.Exact))
	c.MemoryLimit = 0
	c.DeviceBudgetPages, c.Eviction, c.PrefetchPages, c.PrefetchCrossLayer = 64, pagestore.EvictScore, 8, true
	g := GridConfigProto(c)
	if g == nil {
		t.Fatal("config does not encode")
	}
	if g.DeviceBudgetPages != 64 || g.Eviction != "score" || g.PrefetchPages != 8 || !g.PrefetchCrossLayer {
		t.Fatalf("wire config: %+v", g)
	}
	back, err := GridConfigFromProto(g)
	if err != nil || !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip: %+v, %v\nwant %+v", back, err, c)
	}

	// Off (the zero values) round-trips too, and "" is lru.
	off := workerConfig(engineConfig(2, 1, plan.Exact))
	off.MemoryLimit = 0
	g = GridConfigProto(off)
	if g.Eviction != "lru" {
		t.Errorf("default eviction on the wire: %q, want lru", g.Eviction)
	}
	g.Eviction = ""
	if back, err := GridConfigFromProto(g); err != nil || !reflect.DeepEqual(back, off) {
		t.Errorf("offload off: %+v, %v\nwant %+v", back, err, off)
	}

	bad := func(name string, mut func(*workerv1.GridConfig), want string) {
		t.Helper()
		g := GridConfigProto(c)
		mut(g)
		if _, err := GridConfigFromProto(g); !errors.Is(err, worker.ErrBadMessage) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want ErrBadMessage naming %q", name, err, want)
		}
	}
	bad("unknown eviction", func(g *workerv1.GridConfig) { g.Eviction = "fifo" }, `eviction: `)
	bad("budget over capacity", func(g *workerv1.GridConfig) { g.DeviceBudgetPages = g.CapacityPages + 1 }, "device budget")
	bad("prefetch without budget", func(g *workerv1.GridConfig) { g.DeviceBudgetPages = 0 }, "prefetch")
	bad("cross-layer without prefetch", func(g *workerv1.GridConfig) { g.PrefetchPages = 0 }, "cross-layer")

	neg := c
	neg.DeviceBudgetPages = -1
	if _, err := encodeConfig(neg); !errors.Is(err, worker.ErrBadMessage) || !strings.Contains(err.Error(), "device budget pages") {
		t.Errorf("negative device budget: %v", err)
	}
	neg = c
	neg.PrefetchPages = -1
	if _, err := encodeConfig(neg); !errors.Is(err, worker.ErrBadMessage) || !strings.Contains(err.Error(), "prefetch pages") {
		t.Errorf("negative prefetch: %v", err)
	}
	neg = c
	neg.Eviction = pagestore.Eviction(7)
	if _, err := encodeConfig(neg); !errors.Is(err, worker.ErrBadMessage) || !strings.Contains(err.Error(), "eviction") {
		t.Errorf("unknown eviction: %v", err)
	}
}

// TestNilStaysNil checks that nil slices arrive nil and empty ones empty
// (the mirror keys), and that a layer reply round-trips.
func TestNilStaysNil(t *testing.T) {
	g := geometry{q: 2, kv: 1, d: 2}
	m := worker.LayerRequest{Step: 3, Layer: 1, Ranks: []worker.RankInput{
		{Rank: worker.Rank{CP: 1}, Q: []float32{1, 2, 3, 4}, K: []float32{}, V: nil, MirrorK: nil},
		{Rank: worker.Rank{TP: 1}, Q: []float32{1, 2, 3, 4}, K: nil, V: []float32{5, 6}, MirrorK: []float32{}},
	}}
	r, err := encodeLayer(nil, g, m)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeLayer(g, r, 1, anyDim)
	if err != nil || !reflect.DeepEqual(back, m) {
		t.Fatalf("round trip: %+v, %v\nwant %+v", back, err, m)
	}
	for i, in := range back.Ranks {
		if (in.MirrorK == nil) != (m.Ranks[i].MirrorK == nil) || (in.K == nil) != (m.Ranks[i].K == nil) {
			t.Errorf("rank %d: nil-ness lost: %#v", i, in)
		}
	}
	rep := worker.LayerReply{Ranks: []worker.RankOutput{{Rank: worker.Rank{CP: 0}, Appended: 2, O: []float32{1, 2, 3, 4}, LSE: []float32{-1, float32(math.Inf(-1))},
		Diag: worker.RankDiag{Rows: 2, Indptr: []int32{0, 1, 2}, Pages: []int32{3, -4}, Scores: [][]float32{{1, 2, 3, 4}, nil}}}}}
	pr, err := encodeLayerReply(g, &rep)
	if err != nil {
		t.Fatal(err)
	}
	var out worker.LayerReply
	if err := decodeLayerReply(g, pr, &out); err != nil || !reflect.DeepEqual(out, rep) {
		t.Fatalf("reply round trip: %+v, %v\nwant %+v", out, err, rep)
	}
	tail := worker.RollbackReply{Tail: [][]float32{{1, 2, float32(math.Inf(1)), 4}, {5, 6, 7, 8}}}
	tr, _ := encodeRollbackReply(g, tail)
	if back, err := decodeRollbackReply(g, tr); err != nil || !reflect.DeepEqual(back, tail) {
		t.Fatalf("tail round trip: %+v, %v", back, err)
	}
}

// TestTensorShapes checks the decoder's refusals, overflowing shapes
// included.
func TestTensorShapes(t *testing.T) {
	f := func(shape ...uint32) *workerv1.Tensor {
		return &workerv1.Tensor{Dtype: workerv1.DType_DTYPE_FLOAT32, Shape: shape, Data: make([]byte, 16)}
	}
	cases := []struct {
		t    *workerv1.Tensor
		want []int
		err  string
	}{
		{f(2, 2), nil, ""},
		{f(4), []int{anyDim}, ""},
		{f(1, 4), []int{anyDim, 4}, ""},
		{f(), nil, "shape [] does not hold the 4 elements"},
		{f(2, 2), []int{2, 4}, "x: shape [2 2], want [2 4]"},
		{f(1<<31, 1<<31, 1<<31, 1<<31), nil, "does not hold"},
		{f(math.MaxUint32, math.MaxUint32, 0), nil, "does not hold"},
		{f(0, math.MaxUint32), nil, "does not hold"},
		{&workerv1.Tensor{Dtype: workerv1.DType_DTYPE_FLOAT32, Shape: []uint32{2}, Data: make([]byte, 7)}, nil, "not whole 4-byte elements"},
		{&workerv1.Tensor{Dtype: workerv1.DType_DTYPE_INT32, Shape: []uint32{4}, Data: make([]byte, 16)}, nil, "dtype DTYPE_INT32"},
	}
	for _, tc := range cases {
		d := &dec{what: "t", sentinel: worker.ErrBadMessage}
		x := d.f32(nil, tc.t, "x", tc.want...)
		switch {
		case tc.err == "" && (d.err != nil || len(x) != 4):
			t.Errorf("%v: %v, %v", tc.t.Shape, x, d.err)
		case tc.err != "" && (d.err == nil || !strings.Contains(d.err.Error(), tc.err)):
			t.Errorf("%v: error %v, want %q", tc.t.Shape, d.err, tc.err)
		}
	}
	empty := &workerv1.Tensor{Dtype: workerv1.DType_DTYPE_FLOAT32, Shape: []uint32{0, 4}}
	d := &dec{what: "t", sentinel: worker.ErrBadMessage}
	if x := d.f32(nil, empty, "x", anyDim, 4); x == nil || len(x) != 0 || d.err != nil {
		t.Errorf("empty tensor: %#v, %v", x, d.err)
	}
	if x := d.f32(nil, nil, "x"); x != nil {
		t.Errorf("absent tensor: %#v", x)
	}
}

// TestConfigBounds: each size of a GridConfig message is refused past
// its bound (and at 0) when decoded, as ErrBadMessage (InvalidArgument at
// the API edge) naming the field and the range, before any grid is sized
// from it; at the bound it decodes (issue 28: a client's cp of 4e9 reached
// placement, and a q heads of 1e9 opened a grid).
func TestConfigBounds(t *testing.T) {
	c := workerConfig(engineConfig(2, 1, plan.Exact))
	for _, f := range []struct {
		field string
		set   func(*workerv1.GridConfig, uint32)
		hi    uint32
	}{
		{"layers", func(g *workerv1.GridConfig, v uint32) { g.Layers = v }, MaxGridLayers},
		{"q heads", func(g *workerv1.GridConfig, v uint32) { g.QHeads = v }, MaxGridHeads},
		{"kv heads", func(g *workerv1.GridConfig, v uint32) { g.KvHeads = v }, MaxGridHeads},
		{"head dim", func(g *workerv1.GridConfig, v uint32) { g.HeadDim = v }, MaxGridHeadDim},
		{"page size", func(g *workerv1.GridConfig, v uint32) { g.PageSize = v }, MaxGridPageSize},
		{"cp", func(g *workerv1.GridConfig, v uint32) { g.Cp = v }, MaxGridCP},
		{"tp", func(g *workerv1.GridConfig, v uint32) { g.Tp = v }, MaxGridTP},
		{"capacity pages", func(g *workerv1.GridConfig, v uint32) { g.CapacityPages = v }, plan.MaxPages},
	} {
		for _, v := range []uint32{0, f.hi + 1, 4000000000} {
			g := GridConfigProto(c)
			f.set(g, v)
			_, err := decodeConfig(g)
			want := fmt.Sprintf("%s %d: want 1..%d", f.field, v, f.hi)
			if !errors.Is(err, worker.ErrBadMessage) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s %d: %v, want ErrBadMessage with %q", f.field, v, err, want)
			}
		}
		g := GridConfigProto(c)
		f.set(g, f.hi)
		if _, err := decodeConfig(g); err != nil {
			t.Errorf("%s at its bound %d: %v", f.field, f.hi, err)
		}
	}
}
