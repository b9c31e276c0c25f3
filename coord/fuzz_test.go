package coord_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/api/wire"
	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// fuzzTarget is a single node (CP 1) and one of its sequences with
// tokens in every layer, reached through a real gRPC client: the node's
// coord.Server is not exported, so the requests go through the wire to
// the real Server methods (a panic in one crashes the fuzzed process).
type fuzzTarget struct {
	tb  testing.TB
	ec  engine.Config
	c   *client.Client
	api decodev1.DecodeClient
	rng *rand.Rand
	seq string
	len int // seq's length
	ok  int // accepted calls on seq since it was created
}

func newFuzzTarget(f *testing.F) *fuzzTarget {
	// A tiny model: valid requests are a few dozen bytes, so that the
	// mutator and the minimizer work on the fields rather than on
	// kilobytes of float data.
	ec := geometry(1, 1)
	ec.QHeads, ec.KVHeads, ec.HeadDim = 2, 1, 4
	nodes := startCluster(f, 1, ec)
	c := dial(f, nodes[0])
	ft := &fuzzTarget{tb: f, ec: ec, c: c, api: c.API(), rng: rand.New(rand.NewPCG(5, 6))}
	ft.reset()
	return ft
}

// reset releases the sequence and creates a fresh one with 8 tokens in
// every layer.
func (ft *fuzzTarget) reset() {
	ctx, cancel := callCtx()
	defer cancel()
	if ft.seq != "" {
		if err := ft.c.Release(ctx, ft.seq); err != nil {
			ft.tb.Fatalf("release %s: %v", ft.seq, err)
		}
	}
	id, _, err := ft.c.Create(ctx, plan.Striped)
	if err != nil {
		ft.tb.Fatal(err)
	}
	kv := ft.ec.KVHeads * ft.ec.HeadDim
	for l := range ft.ec.Layers {
		if err := ft.c.Append(ctx, id, l, randVec(ft.rng, 8*kv), randVec(ft.rng, 8*kv)); err != nil {
			ft.tb.Fatal(err)
		}
	}
	ft.seq, ft.len, ft.ok = id, 8, 0
}

func (ft *fuzzTarget) length(t *testing.T) int {
	ctx, cancel := callCtx()
	defer cancel()
	n, err := ft.c.Len(ctx, ft.seq)
	if err != nil {
		t.Fatalf("length of %s: %v", ft.seq, err)
	}
	return n
}

// check runs call and checks its answer: no INTERNAL or UNKNOWN code, no
// missed deadline (a hang), and the sequence's length unchanged when the
// call was refused.
func (ft *fuzzTarget) check(t *testing.T, what string, req proto.Message, call func(context.Context) error) {
	before := ft.len
	ctx, cancel := callCtx()
	err := call(ctx)
	cancel()
	switch code := status.Code(err); code {
	case codes.Internal, codes.Unknown, codes.DeadlineExceeded:
		t.Fatalf("%s %v: %v", what, req, err)
	case codes.OK:
		ft.ok++
	}
	after := ft.length(t)
	if err != nil && after != before {
		t.Fatalf("%s refused (%v) but the length went from %d to %d: %v", what, err, before, after, req)
	}
	ft.len = after
	// Keep the sequence small: the accepted appends and steps grow it.
	if status.Code(err) == codes.ResourceExhausted || ft.ok >= 64 {
		ft.reset()
	}
}

// FuzzDecodeStep sends arbitrary StepRequests (items[0] on the real
// sequence half of the time) to a running node.
func FuzzDecodeStep(f *testing.F) {
	ft := newFuzzTarget(f)
	ec := ft.ec
	kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
	rng := rand.New(rand.NewPCG(1, 1))
	valid := func(withKV bool, budget uint32) []byte {
		it := &decodev1.StepItem{Sequence: ft.seq, Q: wire.Float32Tensor(randVec(rng, qd), ec.QHeads, ec.HeadDim), BudgetTokens: budget}
		if withKV {
			it.K = wire.Float32Tensor(randVec(rng, kv), ec.KVHeads, ec.HeadDim)
			it.V = wire.Float32Tensor(randVec(rng, kv), ec.KVHeads, ec.HeadDim)
		}
		b, err := proto.Marshal(&decodev1.StepRequest{Layer: 1, Items: []*decodev1.StepItem{it}, Diagnostics: withKV})
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	f.Add(valid(true, 0), true)
	f.Add(valid(false, 8), true)
	f.Add(valid(true, 0), false)
	f.Add([]byte{}, true)
	f.Fuzz(func(t *testing.T, data []byte, real bool) {
		req := &decodev1.StepRequest{}
		if proto.Unmarshal(data, req) != nil {
			t.Skip()
		}
		if real {
			if len(req.Items) == 0 {
				req.Items = append(req.Items, &decodev1.StepItem{})
			}
			if req.Items[0] == nil {
				req.Items[0] = &decodev1.StepItem{}
			}
			req.Items[0].Sequence = ft.seq
		}
		ft.check(t, "step", req, func(ctx context.Context) error {
			_, err := ft.api.Step(ctx, req)
			return err
		})
	})
}

// FuzzDecodeAppend sends arbitrary AppendRequests (on the real sequence
// half of the time) to a running node.
func FuzzDecodeAppend(f *testing.F) {
	ft := newFuzzTarget(f)
	ec := ft.ec
	kv := ec.KVHeads * ec.HeadDim
	rng := rand.New(rand.NewPCG(2, 2))
	valid := func(n int, layer uint32) []byte {
		b, err := proto.Marshal(&decodev1.AppendRequest{Sequence: ft.seq, Layer: layer,
			K: wire.Float32Tensor(randVec(rng, n*kv), n, ec.KVHeads, ec.HeadDim),
			V: wire.Float32Tensor(randVec(rng, n*kv), n, ec.KVHeads, ec.HeadDim)})
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	f.Add(valid(1, 0), true)
	f.Add(valid(3, 1), true)
	f.Add(valid(2, 0), false)
	f.Add([]byte{}, true)
	f.Fuzz(func(t *testing.T, data []byte, real bool) {
		req := &decodev1.AppendRequest{}
		if proto.Unmarshal(data, req) != nil {
			t.Skip()
		}
		if real {
			req.Sequence = ft.seq
		}
		ft.check(t, "append", req, func(ctx context.Context) error {
			_, err := ft.api.Append(ctx, req)
			return err
		})
	})
}
