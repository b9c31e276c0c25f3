package client

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// TestStepsStreamKept: a step that runs to the model's last layer leaves
// its Steps stream open and the next step over the same sequence runs on
// it, through the coordinating node and through a node that relays the
// stream; a step ended early, or failed, ends its stream, and the next
// step opens another; a stream the node ended between steps costs the
// next step nothing (it goes out on a fresh one).
func TestStepsStreamKept(t *testing.T) {
	ec := engine.DefaultConfig()
	ec.Layers, ec.QHeads, ec.KVHeads, ec.HeadDim, ec.PageSize = 3, 4, 2, 8, 4
	ec.CP, ec.CapacityPages, ec.Selection = 2, 64, plan.Exact
	ec.StepTimeout, ec.MemoryLimit = 2*time.Second, memlimit.NoLimit
	nodes := nodetest.Start(t, "k", 2, ec, nil)
	for at := range nodes {
		t.Run(fmt.Sprintf("node%d", at), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			c, err := Dial(ctx, nodes[at].Addr(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			id, _, err := c.Create(ctx, plan.Striped)
			if err != nil {
				t.Fatal(err)
			}
			kv := make([]float32, 9*ec.KVHeads*ec.HeadDim)
			for l := range ec.Layers {
				if err := c.Append(ctx, id, l, kv, kv); err != nil {
					t.Fatal(err)
				}
			}
			h := c.Handle(id)
			q, k := make([]float32, ec.QHeads*ec.HeadDim), make([]float32, ec.KVHeads*ec.HeadDim)
			for j := range q {
				q[j] = float32(j%5) / 5
			}
			// step runs layers [0, upto) of a step, with a new token when
			// upto is every layer, and ends it; it returns the stream kept
			// after it.
			step := func(upto int) *stepsStream {
				t.Helper()
				whole := upto == ec.Layers
				st, err := c.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: h, New: whole}}})
				if err != nil {
					t.Fatal(err)
				}
				var res decode.Result
				kl := k
				if !whole {
					kl = nil
				}
				for l := range upto {
					if err := st.Layer(ctx, l, decode.Host(q), decode.Host(kl), decode.Host(kl), &res); err != nil {
						t.Fatalf("layer %d: %v", l, err)
					}
				}
				if err := st.End(ctx); err != nil {
					t.Fatal(err)
				}
				c.kept.mu.Lock()
				defer c.kept.mu.Unlock()
				return c.kept.m[id]
			}
			first := step(ec.Layers)
			if first == nil {
				t.Fatal("no stream kept after a whole step")
			}
			for i := range 3 {
				if got := step(ec.Layers); got != first {
					t.Fatalf("step %d: ran on another stream than the first step's", i+1)
				}
			}
			if got := step(1); got != nil {
				t.Fatal("a stream kept after a step ended early")
			}
			second := step(ec.Layers)
			if second == nil || second == first {
				t.Fatalf("after a step ended early: kept %p, the first stream %p; want a new one", second, first)
			}
			// A failed step: layer 1 before layer 0.
			st, err := c.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: h}}})
			if err != nil {
				t.Fatal(err)
			}
			var res decode.Result
			if err := st.Layer(ctx, 1, decode.Host(q), decode.Host(nil), decode.Host(nil), &res); !errors.Is(err, decode.ErrBadInput) {
				t.Fatalf("layer 1 first: %v, want bad input", err)
			}
			st.End(ctx)
			third := step(ec.Layers)
			if third == nil {
				t.Fatal("no stream kept after a whole step")
			}
			// The node ends the kept stream (refusing a layer message
			// where a begin belongs); the next step goes out on a fresh
			// one.
			if err := third.stream.Send(&decodev1.StepsRequest{Items: []*decodev1.StepItem{{Sequence: id}}}); err != nil {
				t.Fatal(err)
			}
			if _, err := third.stream.Recv(); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("a layer message after a step: %v, want INVALID_ARGUMENT", err)
			}
			if got := step(ec.Layers); got == nil || got == third {
				t.Fatalf("after the kept stream ended: kept %p, the ended one %p; want a new one", got, third)
			}
			n, err := c.Len(ctx, id)
			if err != nil || n != 9+7 {
				t.Fatalf("length %d (%v), want %d", n, err, 9+7)
			}
		})
	}
}

// TestKeptStepsBounded: at most maxKept streams stay kept; one more
// step's stream ends instead, and so does every stream on close.
func TestKeptStepsBounded(t *testing.T) {
	var k keptSteps
	ended := 0
	stream := func() *stepsStream { return &stepsStream{cancel: func() { ended++ }} }
	for i := range maxKept + 1 {
		k.put(fmt.Sprint(i), stream())
	}
	if len(k.m) != maxKept || ended != 1 {
		t.Fatalf("%d kept, %d ended after %d puts; want %d and 1", len(k.m), ended, maxKept+1, maxKept)
	}
	if ks, fresh := k.take("0"); ks == nil || fresh {
		t.Fatal("the first stream was not kept")
	}
	k.close()
	k.put("x", stream())
	if len(k.m) != 0 || ended != maxKept+1 {
		t.Fatalf("after close: %d kept, %d ended; want 0 and %d", len(k.m), ended, maxKept+1)
	}
}
