package node_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/internal/testcert"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// startTLSCluster starts n nodes with mutual TLS, each with its own
// certificate of ca.
func startTLSCluster(t *testing.T, n int, ca *testcert.CA) []*node.Node {
	t.Helper()
	return nodetest.Start(t, "n", n, geometry(3, 1, plan.Exact), func(i int, c *node.Config) {
		c.Plaintext, c.TLS = false, ca.MutualTLS(ca.Issue(t, fmt.Sprintf("n%d", i)))
	})
}

// rawStatus calls Status once (fail fast, no wait for ready) over a
// connection with creds and returns the error.
func rawStatus(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	_, err = decodev1.NewDecodeClient(cc).Status(ctx, &decodev1.StatusRequest{})
	return err
}

// A 3-node cluster with mutual TLS (every node its own certificate of one
// CA): a client with a certificate of that CA creates a CP 3 sequence
// (ranks on all three nodes: the worker API and the collective
// transports between the nodes run over TLS too), appends, steps, forks
// and rolls back, also through another node (forwarding over TLS); a
// client without a certificate, one with a certificate of another CA,
// one that does not trust the nodes' CA, and a plaintext client are
// refused.
func TestTLSCluster(t *testing.T) {
	ca := testcert.NewCA(t, "questrt test CA")
	nodes := startTLSCluster(t, 3, ca)
	addr := nodes[0].Addr()
	clientCert := ca.Issue(t, "client")

	t.Run("mutual", func(t *testing.T) {
		creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{clientCert}, RootCAs: ca.Pool, MinVersion: tls.VersionTLS13})
		dialTLS := func(nd *node.Node) *client.Client {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			c, err := client.Dial(ctx, nd.Addr(), client.Options{Creds: creds})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		c, other := dialTLS(nodes[0]), dialTLS(nodes[1])
		g := c.Geometry()
		kv, qd := g.KVHeads*g.HeadDim, g.QHeads*g.HeadDim
		rng := mrand.New(mrand.NewPCG(7, 8))
		call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(t.Context(), 5*time.Second) }

		ctx, cancel := call()
		id, on, err := c.Create(ctx, plan.Striped)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, n := range on {
			seen[n] = true
		}
		if len(on) != 3 || len(seen) != 3 {
			t.Fatalf("create: ranks on %v, want the 3 nodes", on)
		}
		const tokens = 30
		for l := range g.Layers {
			ctx, cancel := call()
			err := c.Append(ctx, id, l, randVec(rng, tokens*kv), randVec(rng, tokens*kv))
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
		for step := range 2 {
			for l := range g.Layers {
				via := c
				if step == 1 {
					via = other // forwarded to n0 over TLS
				}
				ctx, cancel := call()
				res, err := via.Step(ctx, l, []client.Item{{Seq: id, Q: randVec(rng, qd), K: randVec(rng, kv), V: randVec(rng, kv)}}, client.StepOptions{})
				cancel()
				if err != nil {
					t.Fatalf("step %d layer %d: %v", step, l, err)
				}
				if len(res.O) != qd || res.Plans[0].Pages == 0 {
					t.Fatalf("step %d layer %d: %d outputs, plan %+v", step, l, len(res.O), res.Plans[0])
				}
			}
		}
		ctx, cancel = call()
		defer cancel()
		if n, err := other.Len(ctx, id); err != nil || n != tokens+2 {
			t.Fatalf("length %d (%v), want %d", n, err, tokens+2)
		}
		child, err := other.Fork(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Rollback(ctx, child, 5); err != nil {
			t.Fatal(err)
		}
		if n, err := c.Len(ctx, child); err != nil || n != tokens+2-5 {
			t.Fatalf("child length %d (%v), want %d", n, err, tokens+2-5)
		}
		for _, s := range []string{child, id} {
			if err := c.Release(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
	})

	refused := []struct {
		name  string
		creds credentials.TransportCredentials
	}{
		{"no client certificate", credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS13})},
		{"certificate of another CA", credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS13,
			Certificates: []tls.Certificate{testcert.NewCA(t, "rogue CA").Issue(t, "rogue")}})},
		{"client does not trust the nodes' CA", credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13,
			Certificates: []tls.Certificate{clientCert}, RootCAs: testcert.NewCA(t, "other CA").Pool})},
		{"plaintext", insecure.NewCredentials()},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			// A fail-fast call: the handshake (or, under TLS 1.3, the
			// first write after it) fails, and grpc answers UNAVAILABLE.
			err := rawStatus(t, addr, tc.creds)
			if code := status.Code(err); code != codes.Unavailable {
				t.Fatalf("call: %v, want UNAVAILABLE", err)
			}
			t.Logf("refused: %v", err)
			// client.Dial waits for the connection to be ready: it fails
			// at its deadline.
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			c, err := client.Dial(ctx, addr, client.Options{Creds: tc.creds})
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			if code := status.Code(errors.Unwrap(err)); code != codes.DeadlineExceeded {
				t.Fatalf("dial: %v, want DEADLINE_EXCEEDED", err)
			}
			t.Logf("dial: %v", err)
		})
	}
}

// A 2-node cluster with role certificates and RequireCertRoles: a client
// certificate creates a CP 2 sequence (the nodes' worker calls and
// collective streams between them pass as nodes'), appends and steps,
// also forwarded; the same certificate calling the worker API directly
// is refused PERMISSION_DENIED, and so is a certificate without a role on
// the client API.
func TestTLSClusterRoles(t *testing.T) {
	ca := testcert.NewCA(t, "questrt test CA")
	nodes := nodetest.Start(t, "r", 2, geometry(2, 1, plan.Exact), func(i int, c *node.Config) {
		c.Plaintext, c.TLS = false, ca.MutualTLS(ca.IssueNode(t, fmt.Sprintf("r%d", i)))
		c.RequireCertRoles = true
	})
	creds := func(cert tls.Certificate) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool, MinVersion: tls.VersionTLS13})
	}
	clientCreds := creds(ca.IssueClient(t, "client"))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, nodes[1].Addr(), client.Options{Creds: clientCreds})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g := c.Geometry()
	kv, qd := g.KVHeads*g.HeadDim, g.QHeads*g.HeadDim
	rng := mrand.New(mrand.NewPCG(9, 10))
	id, on, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	if len(on) != 2 || on[0] == on[1] {
		t.Fatalf("create: ranks on %v, want both nodes", on)
	}
	for l := range g.Layers {
		if err := c.Append(ctx, id, l, randVec(rng, 10*kv), randVec(rng, 10*kv)); err != nil {
			t.Fatal(err)
		}
		res, err := c.Step(ctx, l, []client.Item{{Seq: id, Q: randVec(rng, qd), K: randVec(rng, kv), V: randVec(rng, kv)}}, client.StepOptions{})
		if err != nil || len(res.O) != qd {
			t.Fatalf("step layer %d: %v", l, err)
		}
	}

	cc, err := grpc.NewClient(nodes[0].Addr(), grpc.WithTransportCredentials(clientCreds))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, err = workerv1.NewWorkerClient(cc).Keys(ctx, &workerv1.KeysRequest{})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "needs a node certificate") {
		t.Fatalf("worker call with a client certificate: %v, want PERMISSION_DENIED", err)
	}
	if err := rawStatus(t, nodes[0].Addr(), creds(ca.Issue(t, "legacy"))); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("client API with a certificate without a role: %v, want PERMISSION_DENIED", err)
	}
	// The collective benchmark: a client certificate cannot open a bench
	// rank on a node, but runs the benchmark through a coordinator (the
	// client API, as questctl bench collective --addr does), which opens
	// and runs the ranks with its node certificate, its own benches.
	spec := &workerv1.BenchSpec{Batch: 1, KvHeads: 1, QHeads: 2, HeadDim: 8, K: 2, Pages: 8, Steps: 2, TimeoutNs: int64(10 * time.Second)}
	_, err = workerv1.NewWorkerClient(cc).OpenBench(ctx, &workerv1.OpenBenchRequest{Bench: "r0/x", Size: 2, Spec: spec})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("OpenBench with a client certificate: %v, want PERMISSION_DENIED", err)
	}
	bctx, bcancel := context.WithTimeout(t.Context(), time.Minute) // a run under load: not the test's 10 s
	defer bcancel()
	brep, err := decodev1.NewDecodeClient(cc).BenchCollective(bctx, &decodev1.BenchCollectiveRequest{Nodes: 2, Spec: spec})
	if err != nil {
		t.Fatalf("BenchCollective through the client API with a client certificate: %v", err)
	}
	if rs := brep.GetRanks(); len(rs) != 2 || rs[0].GetNode() != "r0" || rs[1].GetNode() != "r1" || !rs[0].GetTls() || !rs[1].GetTls() || len(rs[0].GetReport()) == 0 {
		t.Fatalf("BenchCollective ranks %v, want r0 (the node asked) then r1, both over TLS, with reports", rs)
	}
	if err := c.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
}
