package remote

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// TestBadInputChangesNothing sends malformed and misdirected messages to
// a node of a CP 2 grid, raw (shapes, dtypes, overflowing shapes) and
// through a Client (NaN, unknown sequence, grid and view, budget, layer):
// each answers the right code, a message naming the field, an error that
// errors.Is the right sentinel, and the sequence's length on every rank
// is unchanged afterwards.
func TestBadInputChangesNothing(t *testing.T) {
	nodes := startNodes(t, 2, DefaultServerConfig())
	c := engineConfig(2, 1, plan.Exact)
	nr := []NodeRanks{{Conn: nodes[0].conn, Ranks: []worker.Rank{{TP: 0, CP: 0}}}, {Conn: nodes[1].conn, Ranks: []worker.Rank{{TP: 0, CP: 1}}}}
	e, clients := openRemote(t, c, nr, "bad")
	seq, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10 // tokens per layer: pages 0 and 2 on rank 0, page 1 on rank 1
	rng := rand.New(rand.NewPCG(1, 2))
	tok := c.KVHeads * c.HeadDim
	for layer := range c.Layers {
		if err := e.Append(seq, layer, randVec(rng, n*tok), randVec(rng, n*tok)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	api := workerv1.NewWorkerClient(nodes[0].conn)
	ref := &workerv1.GridRef{Grid: "bad", View: 1}
	cl := clients[0]
	r0 := worker.Rank{TP: 0, CP: 0}
	f32 := func(shape []uint32, elems int) *workerv1.Tensor {
		return &workerv1.Tensor{Dtype: workerv1.DType_DTYPE_FLOAT32, Shape: shape, Data: make([]byte, 4*elems)}
	}
	nan := randVec(rng, 2*tok)
	nan[5] = float32(math.NaN())
	good := randVec(rng, 2*tok)
	step := uint64(1 << 40) // above the engine's step ids; increases
	begin := func() error {
		step++
		return cl.BeginStep(ctx, worker.BeginRequest{Step: step, Layer: 1, Seqs: []worker.StepSeq{{Seq: uint64(seq), Len: n}}})
	}
	// layerRaw sends a layer request with q as given inside an open step.
	layerRaw := func(q *workerv1.Tensor) error {
		if err := begin(); err != nil {
			return err
		}
		defer cl.EndStep(ctx, worker.EndRequest{Step: step, Failed: true, Layers: []int{1}})
		_, err := api.Layer(ctx, &workerv1.LayerRequest{Ref: ref, Step: step, Layer: 1,
			Ranks: []*workerv1.RankInput{{Rank: &workerv1.Rank{}, Q: q}}})
		return err
	}
	// q per rank: [1 seq][8 heads][16].
	cases := []struct {
		name     string
		call     func() error
		code     codes.Code
		sentinel error
		msg      string
	}{
		{"k shape", func() error {
			_, err := api.Append(ctx, &workerv1.AppendRequest{Ref: ref, Seq: uint64(seq), Rank: &workerv1.Rank{}, Layer: 0, Start: n, Tokens: 2,
				K: f32([]uint32{2, 4, 32}, 256), V: f32([]uint32{2, 4, 16}, 128)})
			return err
		}, codes.InvalidArgument, worker.ErrBadMessage, "append request: k: shape [2 4 32], want [* 4 16]"},
		{"mirror k without replicated selection", func() error {
			return cl.Append(ctx, worker.AppendRequest{Seq: uint64(seq), Rank: r0, Layer: 0, Start: n, Tokens: 2, K: good, V: good, MirrorK: good})
		}, codes.InvalidArgument, worker.ErrBadMessage, "mirror keys without replicated selection"},
		{"shape without its data", func() error {
			_, err := api.Append(ctx, &workerv1.AppendRequest{Ref: ref, Seq: uint64(seq), Rank: &workerv1.Rank{}, Start: n, Tokens: 2,
				K: f32([]uint32{3, 4, 16}, 128), V: f32([]uint32{2, 4, 16}, 128)})
			return err
		}, codes.InvalidArgument, worker.ErrBadMessage, "k: shape [3 4 16] does not hold the 128 elements"},
		{"NaN in k", func() error {
			return cl.Append(ctx, worker.AppendRequest{Seq: uint64(seq), Rank: r0, Layer: 0, Start: n, Tokens: 2, K: nan, V: nan})
		}, codes.InvalidArgument, worker.ErrBadMessage, "k is not finite"},
		{"unknown sequence", func() error {
			return cl.Append(ctx, worker.AppendRequest{Seq: 99, Rank: r0, Layer: 0, Start: 0, Tokens: 1, K: nan[:tok], V: nan[:tok]})
		}, codes.NotFound, worker.ErrUnknownSequence, "unknown sequence: 99"},
		{"unknown grid", func() error {
			return NewClient(nodes[0].conn, GridRef{Grid: "nope", View: 1}, workerConfig(c)).Release(ctx, worker.ReleaseRequest{Seq: uint64(seq)})
		}, codes.NotFound, ErrUnknownGrid, `"nope"`},
		{"wrong view", func() error {
			return NewClient(nodes[0].conn, GridRef{Grid: "bad", View: 2}, workerConfig(c)).Release(ctx, worker.ReleaseRequest{Seq: uint64(seq)})
		}, codes.FailedPrecondition, ErrWrongView, "grid bad: the call's view 2 is not the one the grid was opened under"},
		{"budget below one page", func() error {
			step++
			return cl.BeginStep(ctx, worker.BeginRequest{Step: step, Layer: 1, Seqs: []worker.StepSeq{{Seq: uint64(seq), Len: n, Budget: 2}}})
		}, codes.InvalidArgument, worker.ErrBadMessage, "budget 2 tokens is below one page"},
		{"layer out of range", func() error {
			return cl.Append(ctx, worker.AppendRequest{Seq: uint64(seq), Rank: r0, Layer: 5, Start: n, Tokens: 1, K: nan[:tok], V: nan[:tok]})
		}, codes.InvalidArgument, worker.ErrBadMessage, "layer 5 outside 0..1"},
		{"negative start", func() error {
			return cl.Append(ctx, worker.AppendRequest{Seq: uint64(seq), Rank: r0, Layer: 0, Start: -1, Tokens: 1, K: nan[:tok], V: nan[:tok]})
		}, codes.OK, worker.ErrBadMessage, "start -1 is negative"},
		{"rank not hosted", func() error {
			return cl.Append(ctx, worker.AppendRequest{Seq: uint64(seq), Rank: worker.Rank{CP: 1}, Layer: 0, Start: n, Tokens: 1})
		}, codes.InvalidArgument, worker.ErrNotHosted, "(tp 0, cp 1)"},
		{"q shape", func() error { return layerRaw(f32([]uint32{1, 8, 32}, 256)) },
			codes.InvalidArgument, worker.ErrBadMessage, "layer request: ranks[0].q: shape [1 8 32], want [1 8 16]"},
		{"q dtype", func() error {
			q := f32([]uint32{1, 8, 16}, 128)
			q.Dtype = workerv1.DType_DTYPE_INT32
			return layerRaw(q)
		}, codes.InvalidArgument, worker.ErrBadMessage, "ranks[0].q: dtype DTYPE_INT32, want DTYPE_FLOAT32"},
		{"q overflowing shape", func() error {
			return layerRaw(f32([]uint32{1, 8, 16, math.MaxUint32, math.MaxUint32, math.MaxUint32}, 128))
		}, codes.InvalidArgument, worker.ErrBadMessage, "ranks[0].q: shape [1 8 16 4294967295 4294967295 4294967295], want [1 8 16]"},
		{"q not finite", func() error {
			if err := begin(); err != nil {
				return err
			}
			defer cl.EndStep(ctx, worker.EndRequest{Step: step, Failed: true, Layers: []int{1}})
			q := randVec(rng, 8*16)
			q[3] = float32(math.Inf(1))
			var rep worker.LayerReply
			err := cl.Layer(ctx, worker.LayerRequest{Step: step, Layer: 1, Ranks: []worker.RankInput{{Rank: r0, Q: q}}}, &rep)
			if len(rep.Ranks) != 1 || rep.Ranks[0].Appended != 0 {
				t.Errorf("refused layer: reply %+v", rep.Ranks)
			}
			return err
		}, codes.InvalidArgument, worker.ErrBadMessage, "query must be 128 finite floats"},
		{"layer without a step", func() error {
			var rep worker.LayerReply
			return cl.Layer(ctx, worker.LayerRequest{Step: 5, Layer: 1, Ranks: []worker.RankInput{{Rank: r0, Q: make([]float32, 128)}}}, &rep)
		}, codes.FailedPrecondition, worker.ErrStep, "no open step"},
		{"rollback of nothing", func() error {
			_, err := cl.Rollback(ctx, worker.RollbackRequest{Seq: uint64(seq), Rank: r0, Len: n, Drop: 0})
			return err
		}, codes.InvalidArgument, worker.ErrBadMessage, "drop 0 of 10 tokens"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil {
				t.Fatal("no error")
			}
			if tc.code != codes.OK { // codes.OK: refused by the client, no call made
				if got := status.Code(err); got != tc.code {
					t.Errorf("code %v, want %v: %v", got, tc.code, err)
				}
			}
			if !errors.Is(FromStatus(err), tc.sentinel) {
				t.Errorf("error does not wrap %v: %v", tc.sentinel, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("message %q does not say %q", err, tc.msg)
			}
			// Nothing changed: every rank holds its share of n tokens.
			for i, cl := range clients {
				for layer := range c.Layers {
					if err := cl.Check(ctx, worker.CheckRequest{Seq: uint64(seq), Layer: layer, Len: n, Append: 1}); err != nil {
						t.Fatalf("node %d layer %d after the bad message: %v", i, layer, err)
					}
				}
			}
		})
	}
	if l, err := e.Len(seq); err != nil || l != n {
		t.Fatalf("length %d, %v; want %d", l, err, n)
	}
}
