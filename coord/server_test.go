package coord_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/api/wire"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// geometry is a small model: 2 layers, 8 query heads, 4 KV heads of 16,
// pages of 4 tokens, a budget of 24 tokens.
func geometry(cp, tp int) engine.Config { return nodetest.Geometry(cp, tp, plan.Exact) }

// startCluster starts n plaintext nodes n0.. (nodetest.Start).
func startCluster(tb testing.TB, n int, ec engine.Config) []*node.Node {
	tb.Helper()
	return nodetest.Start(tb, "n", n, ec, nil)
}

func dial(tb testing.TB, nd *node.Node) *client.Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, nd.Addr(), client.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// callCtx bounds one call.
func callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// tensor is a raw tensor: any dtype, shape and data.
func tensor(dt workerv1.DType, shape []uint32, x []float32) *workerv1.Tensor {
	data := make([]byte, 4*len(x))
	for i, f := range x {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(f))
	}
	return &workerv1.Tensor{Dtype: dt, Shape: shape, Data: data}
}

// with returns a copy of x with x[i] = f.
func with(x []float32, i int, f float32) []float32 {
	y := append([]float32(nil), x...)
	y[i] = f
	return y
}

// Every RPC of the Decode service refuses bad input with the documented
// code and a message naming what is wrong, and a refused call changes
// nothing: the lengths of every sequence stay put and a valid step still
// works after it (a 2-node cluster, CP 2: every sequence has a rank on
// both nodes; calls go to n0, some for n1's sequences, forwarded).
func TestBadInput(t *testing.T) {
	ec := geometry(2, 1)
	nodes := startCluster(t, 2, ec)
	c0, c1 := dial(t, nodes[0]), dial(t, nodes[1])
	api := c0.API()
	rng := rand.New(rand.NewPCG(3, 4))
	kvd, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
	const tokens = 12

	create := func(c *client.Client) string {
		ctx, cancel := callCtx()
		defer cancel()
		id, _, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	appendTo := func(id string, layer, n int) {
		ctx, cancel := callCtx()
		defer cancel()
		if err := c0.Append(ctx, id, layer, randVec(rng, n*kvd), randVec(rng, n*kvd)); err != nil {
			t.Fatal(err)
		}
	}
	// s0, s0b: coordinated by n0; s1: by n1; uneven: n0's, with tokens
	// in layer 0 only.
	s0, s0b, s1, uneven := create(c0), create(c0), create(c1), create(c0)
	for _, id := range []string{s0, s0b, s1} {
		for l := range ec.Layers {
			appendTo(id, l, tokens)
		}
	}
	appendTo(uneven, 0, 8)
	// huge: n0's, with a key just under the magnitude limit in every
	// layer (engine.MagnitudeLimit: a larger one is refused at append).
	huge := create(c0)
	for l := range ec.Layers {
		k := randVec(rng, 8*kvd)
		k[5] = engine.MagnitudeLimit(ec.HeadDim) * 0.99
		ctx, cancel := callCtx()
		if err := c0.Append(ctx, huge, l, k, randVec(rng, 8*kvd)); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	seqs := []string{s0, s0b, s1, uneven, huge}

	// Valid tensors.
	q := func() *workerv1.Tensor { return wire.Float32Tensor(randVec(rng, qd), ec.QHeads, ec.HeadDim) }
	tok := func() *workerv1.Tensor { return wire.Float32Tensor(randVec(rng, kvd), ec.KVHeads, ec.HeadDim) }
	kv := func(n int) *workerv1.Tensor {
		return wire.Float32Tensor(randVec(rng, n*kvd), n, ec.KVHeads, ec.HeadDim)
	}
	f32, i32 := workerv1.DType_DTYPE_FLOAT32, workerv1.DType_DTYPE_INT32
	u := func(d ...int) []uint32 {
		s := make([]uint32, len(d))
		for i, x := range d {
			s[i] = uint32(x)
		}
		return s
	}
	qv, kv1 := randVec(rng, qd), randVec(rng, kvd)
	kvn := randVec(rng, 3*kvd)

	appendReq := func(seq string, layer uint32, k, v *workerv1.Tensor) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := api.Append(ctx, &decodev1.AppendRequest{Sequence: seq, Layer: layer, K: k, V: v})
			return err
		}
	}
	stepReq := func(layer uint32, items ...*decodev1.StepItem) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := api.Step(ctx, &decodev1.StepRequest{Layer: layer, Items: items})
			return err
		}
	}
	item := func(seq string, q, k, v *workerv1.Tensor) *decodev1.StepItem {
		return &decodev1.StepItem{Sequence: seq, Q: q, K: k, V: v}
	}
	rollback := func(seq string, n uint64) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := api.Rollback(ctx, &decodev1.RollbackRequest{Sequence: seq, Tokens: n})
			return err
		}
	}
	fork := func(seq string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := api.Fork(ctx, &decodev1.ForkRequest{Sequence: seq})
			return err
		}
	}
	release := func(seq string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := api.Release(ctx, &decodev1.ReleaseRequest{Sequence: seq})
			return err
		}
	}
	length := func(seq string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := api.Length(ctx, &decodev1.LengthRequest{Sequence: seq})
			return err
		}
	}
	const unknown = "n0/abc.99" // well formed, n0's, never created
	malformed := []string{"", "x", "n0/zz.1", "n0/1", "/1.1", "n0/1.x", "n0/1.-1"}

	type tcase struct {
		name string
		call func(context.Context) error
		code codes.Code
		msg  string // a substring of the message
	}
	cases := []tcase{
		{"create/placement", func(ctx context.Context) error {
			_, err := api.Create(ctx, &decodev1.CreateRequest{Placement: "diagonal"})
			return err
		}, codes.InvalidArgument, `placement "diagonal"`},

		{"append/k missing", appendReq(s0, 0, nil, kv(3)), codes.InvalidArgument, "k: missing"},
		{"append/v missing", appendReq(s0, 0, kv(3), nil), codes.InvalidArgument, "v: missing"},
		{"append/k head dim", appendReq(s0, 0, tensor(f32, u(3, 4, 8), kvn[:3*4*8]), kv(3)), codes.InvalidArgument, "k: shape [3 4 8], want [* 4 16]"},
		{"append/k rank", appendReq(s0, 0, tensor(f32, u(3*4*16), kvn), kv(3)), codes.InvalidArgument, "k: shape"},
		{"append/k dtype", appendReq(s0, 0, tensor(i32, u(3, 4, 16), kvn), kv(3)), codes.InvalidArgument, "k: dtype"},
		{"append/k unspecified dtype", appendReq(s0, 0, tensor(0, u(3, 4, 16), kvn), kv(3)), codes.InvalidArgument, "k: dtype"},
		{"append/k short data", appendReq(s0, 0, tensor(f32, u(3, 4, 16), kvn[:2*kvd]), kv(3)), codes.InvalidArgument, "k: shape [3 4 16] does not hold"},
		{"append/k ragged bytes", appendReq(s0, 0, &workerv1.Tensor{Dtype: f32, Shape: u(1, 4, 16), Data: make([]byte, 4*kvd+1)}, kv(1)), codes.InvalidArgument, "k: "},
		{"append/v other token count", appendReq(s0, 0, kv(3), kv(2)), codes.InvalidArgument, "v: shape [2 4 16], want [3 4 16]"},
		{"append/v dtype", appendReq(s0, 0, kv(3), tensor(i32, u(3, 4, 16), kvn)), codes.InvalidArgument, "v: dtype"},
		{"append/no tokens", appendReq(s0, 0, tensor(f32, u(0, 4, 16), nil), tensor(f32, u(0, 4, 16), nil)), codes.InvalidArgument, "tokens"},
		{"append/k NaN", appendReq(s0, 1, tensor(f32, u(3, 4, 16), with(kvn, 77, float32(math.NaN()))), kv(3)), codes.InvalidArgument, "non-finite"},
		{"append/v +Inf", appendReq(s0, 1, kv(3), tensor(f32, u(3, 4, 16), with(kvn, 5, float32(math.Inf(1))))), codes.InvalidArgument, "non-finite"},
		{"append/k -Inf", appendReq(s0, 0, tensor(f32, u(3, 4, 16), with(kvn, 0, float32(math.Inf(-1)))), kv(3)), codes.InvalidArgument, "non-finite"},
		{"append/layer", appendReq(s0, 2, kv(3), kv(3)), codes.InvalidArgument, "layer 2"},
		{"append/layer max", appendReq(s0, math.MaxUint32, kv(3), kv(3)), codes.InvalidArgument, "layer 4294967295"},
		{"append/unknown", appendReq(unknown, 0, kv(3), kv(3)), codes.NotFound, unknown},
		{"append/unknown coordinator", appendReq("n7/1.1", 0, kv(3), kv(3)), codes.Unavailable, "n7"},
		{"append/forwarded NaN", appendReq(s1, 0, tensor(f32, u(3, 4, 16), with(kvn, 9, float32(math.NaN()))), kv(3)), codes.InvalidArgument, "non-finite"},
		{"append/forwarded layer", appendReq(s1, 2, kv(3), kv(3)), codes.InvalidArgument, "layer 2"},
		{"append/pool exhausted", appendReq(s0, 0, kv(2048), kv(2048)), codes.ResourceExhausted, "pool"},

		{"step/no items", stepReq(0), codes.InvalidArgument, "items: empty"},
		{"step/nil item", stepReq(0, nil), codes.InvalidArgument, "items[0].sequence"},
		{"step/q missing", stepReq(0, item(s0, nil, nil, nil)), codes.InvalidArgument, "items[0].q: missing"},
		{"step/q shape", stepReq(0, item(s0, tensor(f32, u(16, 8), qv), nil, nil)), codes.InvalidArgument, "items[0].q: shape [16 8], want [8 16]"},
		{"step/q flat", stepReq(0, item(s0, tensor(f32, u(128), qv), nil, nil)), codes.InvalidArgument, "items[0].q: shape"},
		{"step/q dtype", stepReq(0, item(s0, tensor(i32, u(8, 16), qv), nil, nil)), codes.InvalidArgument, "items[0].q: dtype"},
		{"step/q short data", stepReq(0, item(s0, tensor(f32, u(8, 16), qv[:100]), nil, nil)), codes.InvalidArgument, "items[0].q: shape [8 16] does not hold"},
		{"step/q NaN", stepReq(0, item(s0, tensor(f32, u(8, 16), with(qv, 3, float32(math.NaN()))), tok(), tok())), codes.InvalidArgument, "query"},
		{"step/q Inf", stepReq(1, item(s0, tensor(f32, u(8, 16), with(qv, 100, float32(math.Inf(1)))), nil, nil)), codes.InvalidArgument, "query"},
		{"step/k without v", stepReq(0, item(s0, q(), tok(), nil)), codes.InvalidArgument, "items[0].v: missing"},
		{"step/v without k", stepReq(0, item(s0, q(), nil, tok())), codes.InvalidArgument, "items[0].k: missing"},
		{"step/k two tokens", stepReq(0, item(s0, q(), tensor(f32, u(2, 4, 16), kvn[:2*kvd]), tok())), codes.InvalidArgument, "items[0].k: shape"},
		{"step/v dtype", stepReq(0, item(s0, q(), tok(), tensor(i32, u(4, 16), kv1))), codes.InvalidArgument, "items[0].v: dtype"},
		{"step/k NaN", stepReq(0, item(s0, q(), tensor(f32, u(4, 16), with(kv1, 1, float32(math.NaN()))), tok())), codes.InvalidArgument, "non-finite"},
		{"step/v Inf", stepReq(1, item(s0, q(), tok(), tensor(f32, u(4, 16), with(kv1, 63, float32(math.Inf(-1)))))), codes.InvalidArgument, "non-finite"},
		{"step/layer", stepReq(2, item(s0, q(), tok(), tok())), codes.InvalidArgument, "layer 2"},
		{"step/layer max", stepReq(math.MaxUint32, item(s0, q(), nil, nil)), codes.InvalidArgument, "layer 4294967295"},
		{"step/budget 1", stepReq(0, &decodev1.StepItem{Sequence: s0, Q: q(), K: tok(), V: tok(), BudgetTokens: 1}), codes.InvalidArgument, "items[0].budget_tokens 1"},
		{"step/budget 3", stepReq(0, item(s0, q(), nil, nil), &decodev1.StepItem{Sequence: s0b, Q: q(), BudgetTokens: 3}), codes.InvalidArgument, "items[1].budget_tokens 3"},
		{"step/duplicate", stepReq(0, item(s0, q(), tok(), tok()), item(s0b, q(), nil, nil), item(s0, q(), tok(), tok())), codes.InvalidArgument, "appears twice"},
		{"step/two coordinators", stepReq(0, item(s0, q(), tok(), tok()), item(s1, q(), tok(), tok())), codes.InvalidArgument, "items[1].sequence"},
		{"step/two coordinators forwarded first", stepReq(0, item(s1, q(), tok(), tok()), item(s0, q(), tok(), tok())), codes.InvalidArgument, "items[1].sequence"},
		{"step/unknown", stepReq(0, item(unknown, q(), tok(), tok())), codes.NotFound, unknown},
		{"step/unknown second", stepReq(0, item(s0, q(), tok(), tok()), item(unknown, q(), tok(), tok())), codes.NotFound, unknown},
		{"step/bad second q", stepReq(0, item(s0, q(), tok(), tok()), item(s0b, tensor(f32, u(8, 16), with(qv, 0, float32(math.NaN()))), tok(), tok())), codes.InvalidArgument, "batch index 1"},
		{"step/bad second k", stepReq(1, item(s0, q(), tok(), tok()), item(s0b, q(), tensor(f32, u(4, 16), with(kv1, 2, float32(math.Inf(1)))), tok())), codes.InvalidArgument, "non-finite"},
		{"step/malformed second", stepReq(0, item(s0, q(), tok(), tok()), item("x", q(), tok(), tok())), codes.InvalidArgument, "items[1].sequence"},
		{"step/forwarded q NaN", stepReq(0, item(s1, tensor(f32, u(8, 16), with(qv, 7, float32(math.NaN()))), tok(), tok())), codes.InvalidArgument, "query"},
		{"step/forwarded budget", stepReq(1, &decodev1.StepItem{Sequence: s1, Q: q(), BudgetTokens: 2}), codes.InvalidArgument, "budget_tokens 2"},
		{"step/no tokens in layer", stepReq(1, item(uneven, q(), nil, nil)), codes.InvalidArgument, "no tokens in layer 1"},
		// A finite q whose scores against the huge key would overflow
		// float32 (and make a NaN LSE mid-step) is refused up front.
		{"step/score overflow", stepReq(0, item(huge, tensor(f32, u(8, 16), with(qv, 5, 1e19)), nil, nil)), codes.InvalidArgument, "q[5] = 1e+19: beyond"},
		{"step/score overflow with token", stepReq(1, item(huge, tensor(f32, u(8, 16), with(qv, 5, 1e19)), tok(), tok())), codes.InvalidArgument, "q[5] = 1e+19: beyond"},
		{"append/key over the limit", appendReq(s0, 0, wire.Float32Tensor(with(kv1, 3, 1e19), 1, ec.KVHeads, ec.HeadDim), kv(1)), codes.InvalidArgument, "k[3] = 1e+19: beyond"},
		{"step/unknown coordinator", stepReq(0, item("n7/1.1", q(), nil, nil)), codes.Unavailable, "n7"},

		{"rollback/0", rollback(s0, 0), codes.InvalidArgument, "tokens 0"},
		{"rollback/past the start", rollback(s0, tokens+1), codes.InvalidArgument, fmt.Sprintf("%d tokens of %d", tokens+1, tokens)},
		{"rollback/huge", rollback(s0, 1<<40), codes.InvalidArgument, "tokens 1099511627776"},
		{"rollback/max", rollback(s0, math.MaxUint64), codes.InvalidArgument, "tokens"},
		{"rollback/forwarded past the start", rollback(s1, tokens+1), codes.InvalidArgument, "tokens"},
		{"rollback/unknown", rollback(unknown, 1), codes.NotFound, unknown},
		{"rollback/uneven layers", rollback(uneven, 1), codes.FailedPrecondition, "layers have different lengths"},
		{"fork/unknown", fork(unknown), codes.NotFound, unknown},
		{"fork/uneven layers", fork(uneven), codes.FailedPrecondition, "layers have different lengths"},
		{"release/unknown", release(unknown), codes.NotFound, unknown},
		{"release/unknown forwarded", release("n1/abc.99"), codes.NotFound, "n1/abc.99"},
		{"length/unknown", length(unknown), codes.NotFound, unknown},
	}
	for _, id := range malformed {
		cases = append(cases,
			tcase{fmt.Sprintf("append/malformed %q", id), appendReq(id, 0, kv(1), kv(1)), codes.InvalidArgument, "malformed sequence id"},
			tcase{fmt.Sprintf("step/malformed %q", id), stepReq(0, item(id, q(), tok(), tok())), codes.InvalidArgument, "items[0].sequence"},
			tcase{fmt.Sprintf("rollback/malformed %q", id), rollback(id, 1), codes.InvalidArgument, "malformed sequence id"},
			tcase{fmt.Sprintf("fork/malformed %q", id), fork(id), codes.InvalidArgument, "malformed sequence id"},
			tcase{fmt.Sprintf("release/malformed %q", id), release(id), codes.InvalidArgument, "malformed sequence id"},
			tcase{fmt.Sprintf("length/malformed %q", id), length(id), codes.InvalidArgument, "malformed sequence id"},
		)
	}

	lengths := func() map[string]int {
		ls := map[string]int{}
		ctx, cancel := callCtx()
		defer cancel()
		for _, id := range seqs {
			n, err := c0.Len(ctx, id)
			if err != nil {
				t.Fatalf("length of %s: %v", id, err)
			}
			ls[id] = n
		}
		return ls
	}
	before := lengths()
	if before[s0] != tokens || before[s1] != tokens || before[uneven] != 0 {
		t.Fatalf("lengths %v", before)
	}
	validStep := func() {
		ctx, cancel := callCtx()
		defer cancel()
		for _, id := range []string{s0, s1} { // s1: forwarded to n1
			if _, err := c0.Step(ctx, 0, []client.Item{{Seq: id, Q: randVec(rng, qd)}}, client.StepOptions{}); err != nil {
				t.Fatalf("valid step of %s: %v", id, err)
			}
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := callCtx()
			err := tc.call(ctx)
			cancel()
			st := status.Convert(err)
			t.Logf("%v: %s", st.Code(), st.Message())
			after := lengths()
			changed := fmt.Sprint(after) != fmt.Sprint(before)
			validStep()
			if changed {
				t.Errorf("lengths after a refused call: %v, before %v", after, before)
			}
			if st.Code() != tc.code {
				t.Fatalf("%v, want %v", err, tc.code)
			}
			if !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("message %q does not name %q", st.Message(), tc.msg)
			}
		})
	}
	// Nothing was created by the refused calls.
	ctx, cancel := callCtx()
	defer cancel()
	stat, err := c0.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stat.GetSequences() != 4 {
		t.Fatalf("n0 coordinates %d sequences, want 4", stat.GetSequences())
	}
}
