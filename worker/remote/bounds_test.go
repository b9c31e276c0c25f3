package remote

import (
	"context"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// allocBound is the most a refused request may make the node allocate:
// far below what decoding any of the requests below entry by entry
// takes (each declares tens of MiB or more of step state).
const allocBound = 2 << 20

// TestHugeShapesRefused sends a node requests with huge but
// well-formed counts and shapes (a batch of 200,000 sequences, 500,000
// rank inputs, a query tensor of 2^40 elements, a million rollback
// lengths, a key count and a token count beyond any pool) over gRPC:
// each is refused with INVALID_ARGUMENT (or NOT_FOUND for a batch naming
// a sequence the grid does not hold), and the same request handed to
// the server's method allocates less than allocBound bytes in the whole
// process (runtime.MemStats.TotalAlloc): it is refused from its counts
// before anything is decoded for its entries. The sequence still steps
// afterwards.
func TestHugeShapesRefused(t *testing.T) {
	nodes := startNodes(t, 1, DefaultServerConfig())
	c := engineConfig(1, 1, plan.Exact)
	e, clients := openRemote(t, c, []NodeRanks{{Conn: nodes[0].conn, Ranks: []worker.Rank{{}}}}, "huge")
	seq, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	rng := rand.New(rand.NewPCG(5, 6))
	tok := c.KVHeads * c.HeadDim
	for layer := range c.Layers {
		if err := e.Append(seq, layer, randVec(rng, n*tok), randVec(rng, n*tok)); err != nil {
			t.Fatal(err)
		}
	}
	// One deadline for every case: it only bounds a hang. Marshaling
	// the huge requests under -race is slow, and with another test
	// binary beside it on 2 cores the cases passed 30 s (end step:
	// DeadlineExceeded at the 500,000 rank inputs).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, api, cl := nodes[0].srv, workerv1.NewWorkerClient(nodes[0].conn), clients[0]
	ref := &workerv1.GridRef{Grid: "huge", View: 1}
	s := uint64(seq)

	const batch = 200_000
	repeated := &workerv1.BeginRequest{Ref: ref, Step: 1 << 40, Layer: 1}
	unknown := &workerv1.BeginRequest{Ref: ref, Step: 1 << 40, Layer: 1}
	for i := range batch {
		repeated.Seqs = append(repeated.Seqs, &workerv1.StepSeq{Seq: s, Len: n, Budget: 1 << 31})
		unknown.Seqs = append(unknown.Seqs, &workerv1.StepSeq{Seq: s + uint64(i), Len: n})
	}
	const ranks = 500_000
	manyRanks := &workerv1.LayerRequest{Ref: ref, Layer: 1}
	for range ranks {
		manyRanks.Ranks = append(manyRanks.Ranks, &workerv1.RankInput{Rank: &workerv1.Rank{}})
	}
	bigQ := &workerv1.LayerRequest{Ref: ref, Layer: 1, Ranks: []*workerv1.RankInput{{Rank: &workerv1.Rank{},
		Q: &workerv1.Tensor{Dtype: workerv1.DType_DTYPE_FLOAT32, Shape: []uint32{1 << 20, 8, 1 << 20}, Data: make([]byte, 4*8*16)}}}}
	lens := &workerv1.RollbackRequest{Ref: ref, Seq: s, Rank: &workerv1.Rank{}, Lens: make([]uint32, 1<<20)}
	step := uint64(1 << 41)
	cases := []struct {
		name string
		code codes.Code
		req  proto.Message
		// inStep: the request is a Layer of an open step.
		inStep bool
		call   func(ctx context.Context) error
	}{
		{"a batch repeating one sequence", codes.InvalidArgument, repeated, false, func(ctx context.Context) error {
			_, err := srv.BeginStep(ctx, repeated)
			return err
		}},
		{"a batch of unknown sequences", codes.NotFound, unknown, false, func(ctx context.Context) error {
			_, err := srv.BeginStep(ctx, unknown)
			return err
		}},
		{"500,000 rank inputs", codes.InvalidArgument, manyRanks, true, func(ctx context.Context) error {
			_, err := srv.Layer(ctx, manyRanks)
			return err
		}},
		{"a query of 2^40 elements", codes.InvalidArgument, bigQ, true, func(ctx context.Context) error {
			_, err := srv.Layer(ctx, bigQ)
			return err
		}},
		{"a million rollback lengths", codes.InvalidArgument, lens, false, func(ctx context.Context) error {
			_, err := srv.Rollback(ctx, lens)
			return err
		}},
		{"keys of 2^31 pages", codes.InvalidArgument, &workerv1.KeysRequest{Ref: ref, Seq: s, Rank: &workerv1.Rank{}, Count: 1 << 31}, false, func(ctx context.Context) error {
			_, err := srv.Keys(ctx, &workerv1.KeysRequest{Ref: ref, Seq: s, Rank: &workerv1.Rank{}, Count: 1 << 31})
			return err
		}},
		{"an append of 2^40 tokens", codes.InvalidArgument, nil, false, func(ctx context.Context) error {
			_, err := srv.Append(ctx, &workerv1.AppendRequest{Ref: ref, Seq: s, Rank: &workerv1.Rank{}, Start: n, Tokens: 1 << 40,
				K: &workerv1.Tensor{Dtype: workerv1.DType_DTYPE_FLOAT32, Shape: []uint32{1, 4, 16}, Data: make([]byte, 4*64)}})
			return err
		}},
	}
	for _, tc := range cases {
		// Over gRPC (twice for a layer: the server's method is called
		// directly below, in a step of its own).
		for _, direct := range []bool{false, true} {
			if tc.inStep {
				step++
				if err := cl.BeginStep(ctx, worker.BeginRequest{Step: step, Layer: 1, Seqs: []worker.StepSeq{{Seq: s, Len: n}}}); err != nil {
					t.Fatalf("%s: begin: %v", tc.name, err)
				}
				switch r := tc.req.(type) {
				case *workerv1.LayerRequest:
					r.Step = step
				}
			}
			var err error
			var alloc uint64
			if direct {
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				err = tc.call(ctx)
				runtime.ReadMemStats(&after)
				alloc = after.TotalAlloc - before.TotalAlloc
			} else if tc.req != nil {
				err = nodes[0].conn.Invoke(ctx, methodOf(tc.req), tc.req, replyFor(tc.req))
			} else {
				err = tc.call(ctx)
			}
			if tc.inStep {
				if err := cl.EndStep(ctx, worker.EndRequest{Step: step, Failed: true, Layers: []int{1}}); err != nil {
					t.Fatalf("%s: end step: %v", tc.name, err)
				}
			}
			if status.Code(err) != tc.code {
				t.Errorf("%s (direct %v): %v, want %v", tc.name, direct, err, tc.code)
			}
			if direct {
				t.Logf("%s: refused (%v), %d bytes allocated", tc.name, status.Code(err), alloc)
			}
			if direct && alloc > allocBound {
				t.Errorf("%s: the node allocated %d bytes to refuse it, want at most %d", tc.name, alloc, allocBound)
			}
		}
	}

	// Nothing changed: the sequence's keys read back, and it steps.
	if _, err := api.Keys(ctx, &workerv1.KeysRequest{Ref: ref, Seq: s, Rank: &workerv1.Rank{}, Count: 1}); err != nil {
		t.Fatalf("keys after the refusals: %v", err)
	}
	step++
	if err := cl.BeginStep(ctx, worker.BeginRequest{Step: step, Layer: 0, Seqs: []worker.StepSeq{{Seq: s, Len: n}}}); err != nil {
		t.Fatalf("begin after the refusals: %v", err)
	}
	for layer := range c.Layers {
		var rep worker.LayerReply
		q := randVec(rng, c.QHeads*c.HeadDim)
		if err := cl.Layer(ctx, worker.LayerRequest{Step: step, Layer: layer, Ranks: []worker.RankInput{{Q: q}}}, &rep); err != nil {
			t.Fatalf("layer %d after the refusals: %v", layer, err)
		}
		if len(rep.Ranks) != 1 || len(rep.Ranks[0].O) != len(q) {
			t.Fatalf("layer %d after the refusals: %d outputs", layer, len(rep.Ranks))
		}
	}
	if err := cl.EndStep(ctx, worker.EndRequest{Step: step, Layers: []int{0, 1}}); err != nil {
		t.Fatalf("end after the refusals: %v", err)
	}
}

// methodOf is the worker method of a request message.
func methodOf(m proto.Message) string {
	switch m.(type) {
	case *workerv1.BeginRequest:
		return workerv1.Worker_BeginStep_FullMethodName
	case *workerv1.LayerRequest:
		return workerv1.Worker_Layer_FullMethodName
	case *workerv1.RollbackRequest:
		return workerv1.Worker_Rollback_FullMethodName
	case *workerv1.KeysRequest:
		return workerv1.Worker_Keys_FullMethodName
	}
	panic("methodOf: no method for " + string(m.ProtoReflect().Descriptor().FullName()))
}

// replyFor is a new reply message for a request message.
func replyFor(m proto.Message) proto.Message { return replyOf(methodOf(m)) }
