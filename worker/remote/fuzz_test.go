package remote

import (
	"context"
	"math/rand/v2"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// fuzzGrid is one Server (called directly, no gRPC) hosting a connected
// single-rank grid with sequence 1 of n tokens in every layer.
func fuzzGrid(f *testing.F, n int) (*Server, *workerv1.GridRef, worker.Config) {
	cfg := DefaultServerConfig()
	cfg.Plaintext = true
	s, err := NewServer(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	c := worker.Config{
		Layers:      2,
		Geometry:    plan.Geometry{QHeads: 2, KVHeads: 1, HeadDim: 4, PageSize: 2},
		CP:          1,
		TP:          1,
		Capacity:    64,
		Policy:      plan.Policy{PageSize: 2, BudgetTokens: 4, LocalPages: 1},
		MemoryLimit: -1,
	}
	gc, err := encodeConfig(c)
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	ref := &workerv1.GridRef{Grid: "fuzz", View: 1}
	rep, err := s.OpenGrid(ctx, &workerv1.OpenGridRequest{Ref: ref, Config: gc, Ranks: []*workerv1.Rank{{}}})
	if err != nil {
		f.Fatal(err)
	}
	if _, err := s.ConnectGrid(ctx, &workerv1.ConnectGridRequest{Ref: ref, Peers: rep.Addrs}); err != nil {
		f.Fatal(err)
	}
	if _, err := s.Create(ctx, &workerv1.CreateRequest{Ref: ref, Seq: 1, Layout: &workerv1.Layout{Cp: 1, Tp: 1}}); err != nil {
		f.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for layer := range c.Layers {
		r, _ := encodeAppend(ref, geometryOf(c), worker.AppendRequest{Seq: 1, Layer: layer, Tokens: n, K: randVec(rng, n*4), V: randVec(rng, n*4)})
		if _, err := s.Append(ctx, r); err != nil {
			f.Fatal(err)
		}
	}
	return s, ref, c
}

// checkStatus fails unless err is nil or a status with a real code.
func checkStatus(t *testing.T, err error) {
	if err == nil {
		return
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() == codes.OK || st.Code() == codes.Unknown {
		t.Fatalf("not a status: %v", err)
	}
}

// FuzzDecodeLayer feeds arbitrary bytes as a serialized LayerRequest
// through the node's decode and validate path and its worker, inside an
// open step: nothing panics and every answer is a status.
func FuzzDecodeLayer(f *testing.F) {
	s, ref, c := fuzzGrid(f, 5)
	g := geometryOf(c)
	good, _ := encodeLayer(ref, g, worker.LayerRequest{Step: 1, Layer: 1, Ranks: []worker.RankInput{{Q: make([]float32, 8)}}})
	for _, m := range []*workerv1.LayerRequest{good, {}, {Ranks: []*workerv1.RankInput{{}}}} {
		b, _ := proto.Marshal(m)
		f.Add(b, true)
	}
	ctx := context.Background()
	step := uint64(0)
	f.Fuzz(func(t *testing.T, b []byte, keepStep bool) {
		var r workerv1.LayerRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		step++
		if _, err := s.BeginStep(ctx, &workerv1.BeginRequest{Ref: ref, Step: step, Layer: 1, Seqs: []*workerv1.StepSeq{{Seq: 1, Len: 5}}}); err != nil {
			t.Fatal(err)
		}
		r.Ref = ref
		if keepStep {
			r.Step = step
		}
		rep, err := s.Layer(ctx, &r)
		checkStatus(t, err)
		if err == nil && rep.ErrorCode == 0 && len(rep.Ranks) != 1 {
			t.Fatalf("a layer that succeeded answers %d ranks", len(rep.Ranks))
		}
		if _, err := s.EndStep(ctx, &workerv1.EndRequest{Ref: ref, Step: step, Failed: true, Layers: []uint32{r.Layer}}); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzDecodeAppend feeds arbitrary bytes as a serialized AppendRequest
// through the node's decode and validate path and its worker.
func FuzzDecodeAppend(f *testing.F) {
	s, ref, c := fuzzGrid(f, 3)
	g := geometryOf(c)
	good, _ := encodeAppend(ref, g, worker.AppendRequest{Seq: 1, Layer: 0, Start: 3, Tokens: 1, K: make([]float32, 4), V: make([]float32, 4)})
	for _, m := range []*workerv1.AppendRequest{good, {}, {K: &workerv1.Tensor{Shape: []uint32{1 << 31, 1 << 31}}}} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, b []byte) {
		var r workerv1.AppendRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		r.Ref = ref
		_, err := s.Append(ctx, &r)
		checkStatus(t, err)
	})
}

// FuzzDecodeTensor decodes arbitrary shapes and data against wanted dims:
// no panic, no overflow, and a decoded tensor holds exactly its shape's
// product of elements.
func FuzzDecodeTensor(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0}, uint32(1), uint32(2), uint32(0), true)
	f.Add([]byte{}, uint32(0xffffffff), uint32(0xffffffff), uint32(0), false)
	f.Fuzz(func(t *testing.T, data []byte, a, b, c uint32, three bool) {
		shape := []uint32{a, b}
		if three {
			shape = append(shape, c)
		}
		tn := &workerv1.Tensor{Dtype: workerv1.DType_DTYPE_FLOAT32, Shape: shape, Data: data}
		d := &dec{what: "fuzz", sentinel: worker.ErrBadMessage}
		x := d.f32(nil, tn, "x")
		if d.err != nil {
			return
		}
		p := uint64(1)
		for _, s := range shape {
			p *= uint64(s) // only for a shape that decoded: it fits
		}
		if uint64(len(x)) != p || 4*len(x) != len(data) {
			t.Fatalf("shape %v decoded %d elements of %d bytes", shape, len(x), len(data))
		}
	})
}
