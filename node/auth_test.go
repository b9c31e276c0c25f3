package node_test

import (
	"context"
	mrand "math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// A 2-node plaintext cluster with a bearer token on the client API: calls
// without the token or with a wrong one fail UNAUTHENTICATED (unary and
// stream), the health service answers without it, and with the right
// token a CP 2 sequence (ranks on both nodes: the worker API between the
// nodes carries no token) appends and steps, directly and forwarded
// through the other node (unary Step and the Steps stream).
func TestTokenAuth(t *testing.T) {
	const token = "s3cret-token"
	nodes := nodetest.Start(t, "a", 2, geometry(2, 1, plan.Exact), func(_ int, c *node.Config) { c.Token = token })
	cc, err := grpc.NewClient(nodes[0].Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	api := decodev1.NewDecodeClient(cc)
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(t.Context(), 5*time.Second) }

	for _, tc := range []struct {
		name string
		md   []string
	}{
		{"no token", nil},
		{"wrong token", []string{"authorization", "Bearer wrong"}},
		{"token without Bearer", []string{"authorization", token}},
		{"empty bearer", []string{"authorization", "Bearer "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := call()
			defer cancel()
			if len(tc.md) > 0 {
				ctx = metadata.AppendToOutgoingContext(ctx, tc.md...)
			}
			_, err := api.Status(ctx, &decodev1.StatusRequest{}, grpc.WaitForReady(true))
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("status: %v, want UNAUTHENTICATED", err)
			}
			st, err := api.Steps(ctx)
			if err == nil {
				_, err = st.Recv()
			}
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("steps: %v, want UNAUTHENTICATED", err)
			}
		})
	}
	t.Run("health without token", func(t *testing.T) {
		ctx, cancel := call()
		defer cancel()
		r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health: %v %v", r, err)
		}
	})
	t.Run("client without token", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, nodes[0].Addr(), client.Options{})
		if err == nil {
			c.Close()
			t.Fatal("dial without token succeeded")
		}
		if status.Code(errorsUnwrapAll(err)) != codes.Unauthenticated {
			t.Fatalf("dial: %v, want UNAUTHENTICATED", err)
		}
	})

	t.Run("right token", func(t *testing.T) {
		dial := func(nd *node.Node) *client.Client {
			ctx, cancel := call()
			defer cancel()
			c, err := client.Dial(ctx, nd.Addr(), client.Options{Token: token})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		c, other := dial(nodes[0]), dial(nodes[1])
		g := c.Geometry()
		kv, qd := g.KVHeads*g.HeadDim, g.QHeads*g.HeadDim
		rng := mrand.New(mrand.NewPCG(3, 4))
		ctx, cancel := call()
		defer cancel()
		id, on, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		if len(on) != 2 || on[0] == on[1] {
			t.Fatalf("create: ranks on %v, want both nodes", on)
		}
		const tokens = 20
		for l := range g.Layers {
			if err := c.Append(ctx, id, l, randVec(rng, tokens*kv), randVec(rng, tokens*kv)); err != nil {
				t.Fatal(err)
			}
		}
		item := func() []client.Item {
			return []client.Item{{Seq: id, Q: randVec(rng, qd), K: randVec(rng, kv), V: randVec(rng, kv)}}
		}
		for step, via := range []*client.Client{c, other} { // other: forwarded to a0
			for l := range g.Layers {
				res, err := via.Step(ctx, l, item(), client.StepOptions{})
				if err != nil {
					t.Fatalf("step %d layer %d: %v", step, l, err)
				}
				if len(res.O) != qd {
					t.Fatalf("step %d layer %d: %d outputs", step, l, len(res.O))
				}
			}
		}
		// The Steps stream, forwarded.
		res, err := other.Decode(ctx, 0, g.Layers, item(), client.StepOptions{}, func(_ int, items []client.Item, _ *client.StepResult) error {
			items[0].Q = randVec(rng, qd)
			return nil
		})
		if err != nil {
			t.Fatalf("forwarded decode: %v", err)
		}
		if len(res.O) != qd {
			t.Fatalf("forwarded decode: %d outputs", len(res.O))
		}
		if n, err := other.Len(ctx, id); err != nil || n != tokens+3 {
			t.Fatalf("length %d (%v), want %d", n, err, tokens+3)
		}
		if err := other.Release(ctx, id); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("token over plaintext to a non-loopback address", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if c, err := client.Dial(ctx, "192.0.2.1:7070", client.Options{Token: token}); err == nil {
			c.Close()
			t.Fatal("dial succeeded")
		}
	})
}

// errorsUnwrapAll returns the innermost error of a chain of single
// wraps.
func errorsUnwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok || u.Unwrap() == nil {
			return err
		}
		err = u.Unwrap()
	}
}
