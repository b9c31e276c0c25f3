package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/testcert"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// TestGridOwnerOnly: over mutual TLS, every grid method of the worker API
// called by a node that is not the grid's coordinator ("b" on grid
// "a/1/1"), or by a client certificate, is refused PERMISSION_DENIED,
// with a message naming the method and neither the grid nor its owner,
// unary or inside a Calls stream, and changes nothing (the grid still
// decodes for "a"); the same calls by "a" are not refused; a node cannot
// open a grid in another coordinator's name. Calls in process
// (LocalConn) are not checked, even on a context carrying another
// node's peer; a certificate without a role is not checked (it has no
// name). The collective benchmark's methods are checked the same way
// by the bench's id: b and a client can neither open, run nor close a
// bench rank of a's, and no rank is opened by their calls.
func TestGridOwnerOnly(t *testing.T) {
	ca := testcert.NewCA(t, "authz CA")
	srv, err := NewServer(ServerConfig{TLS: ca.MutualTLS(ca.IssueNode(t, "srv"))})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(ca.MutualTLS(ca.IssueNode(t, "srv")))))
	workerv1.RegisterWorkerServer(gs, srv)
	go gs.Serve(lis) // ends with Stop
	t.Cleanup(func() { gs.Stop(); srv.Close() })
	dial := func(cert tls.Certificate) *grpc.ClientConn {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(ca.MutualTLS(cert))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	bCert := ca.IssueNode(t, "b")
	a, b, client, legacy := dial(ca.IssueNode(t, "a")), dial(bCert), dial(ca.IssueClient(t, "a")), dial(ca.Issue(t, "old"))

	const id = "a/1/1"
	c := engineConfig(1, 1, plan.Exact)
	e, _ := openRemote(t, c, []NodeRanks{{Conn: a, Ranks: []worker.Rank{{}}}}, id)
	seq, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	tok := c.KVHeads * c.HeadDim
	for layer := range c.Layers {
		if err := e.Append(seq, layer, randVec(rng, 6*tok), randVec(rng, 6*tok)); err != nil {
			t.Fatal(err)
		}
	}
	ref := &workerv1.GridRef{Grid: id, View: 1}
	const bench = "a/1bench" // a's (benchOwner); "a/1" in a message would disclose it
	benchSpec := &workerv1.BenchSpec{Batch: 1, KvHeads: 1, QHeads: 2, HeadDim: 8, K: 2, Pages: 8, Steps: 1, TimeoutNs: int64(time.Second)}
	if _, err := DecodeBenchSpec(benchSpec, 2); err != nil {
		t.Fatalf("the test's bench spec: %v", err)
	}
	s := uint64(seq)
	calls := map[string]proto.Message{
		workerv1.Worker_ConnectGrid_FullMethodName:   &workerv1.ConnectGridRequest{Ref: ref},
		workerv1.Worker_Create_FullMethodName:        &workerv1.CreateRequest{Ref: ref, Seq: s + 100},
		workerv1.Worker_Fork_FullMethodName:          &workerv1.ForkRequest{Ref: ref, Parent: s, Child: s + 101},
		workerv1.Worker_Release_FullMethodName:       &workerv1.ReleaseRequest{Ref: ref, Seq: s},
		workerv1.Worker_Check_FullMethodName:         &workerv1.CheckRequest{Ref: ref, Seq: s},
		workerv1.Worker_Append_FullMethodName:        &workerv1.AppendRequest{Ref: ref, Seq: s},
		workerv1.Worker_Rollback_FullMethodName:      &workerv1.RollbackRequest{Ref: ref, Seq: s, Rank: &workerv1.Rank{}, Len: 6},
		workerv1.Worker_BeginStep_FullMethodName:     &workerv1.BeginRequest{Ref: ref, Step: 1 << 40},
		workerv1.Worker_Layer_FullMethodName:         &workerv1.LayerRequest{Ref: ref, Step: 1 << 40},
		workerv1.Worker_EndStep_FullMethodName:       &workerv1.EndRequest{Ref: ref, Step: 1 << 40, Failed: true},
		workerv1.Worker_Keys_FullMethodName:          &workerv1.KeysRequest{Ref: ref, Seq: s, Rank: &workerv1.Rank{}, Count: 1},
		workerv1.Worker_Claim_FullMethodName:         &workerv1.ClaimRequest{Ref: ref, Key: 1, Seq: s + 102},
		workerv1.Worker_DropRecovered_FullMethodName: &workerv1.DropRecoveredRequest{Ref: ref, Key: 1},
		workerv1.Worker_Park_FullMethodName:          &workerv1.ParkRequest{Ref: ref, Seq: s},
		workerv1.Worker_CloseGrid_FullMethodName:     &workerv1.CloseGridRequest{Ref: ref},
		workerv1.Worker_OpenGrid_FullMethodName:      &workerv1.OpenGridRequest{Ref: &workerv1.GridRef{Grid: "a/1/2", View: 1}},
		// A bench of a's (BenchID("a")) with a valid spec: without the
		// check, b or a client would make the node listen for it.
		workerv1.Worker_OpenBench_FullMethodName:  &workerv1.OpenBenchRequest{Bench: bench, Rank: 0, Size: 2, Spec: benchSpec},
		workerv1.Worker_RunBench_FullMethodName:   &workerv1.RunBenchRequest{Bench: bench, Peers: []string{"127.0.0.1:1", "127.0.0.1:2"}},
		workerv1.Worker_CloseBench_FullMethodName: &workerv1.CloseBenchRequest{Bench: bench},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	invoke := func(conn grpc.ClientConnInterface, method string, req proto.Message) error {
		return conn.Invoke(ctx, method, req, replyOf(method))
	}
	denied := func(who, method string, err error) {
		t.Helper()
		st, _ := status.FromError(err)
		if st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), method) || strings.Contains(st.Message(), "a/1") || strings.Contains(st.Message(), `"a"`) {
			t.Errorf("%s %s: %v; want PERMISSION_DENIED naming the method only", who, method, err)
		}
	}
	for method, req := range calls {
		denied("node b", method, invoke(b, method, req))
		denied("client", method, invoke(client, method, req))
		// Inside a Calls stream.
		raw, _ := proto.Marshal(req)
		st, err := b.NewStream(ctx, &workerv1.Worker_ServiceDesc.Streams[0], workerv1.Worker_Calls_FullMethodName)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SendMsg(&workerv1.Call{Method: method, Request: raw, Last: true}); err != nil {
			t.Fatal(err)
		}
		var ans workerv1.Answer
		if err := st.RecvMsg(&ans); err != nil {
			t.Fatalf("calls %s: %v", method, err)
		}
		sp := new(spb.Status)
		if err := proto.Unmarshal(ans.GetStatus(), sp); err != nil {
			t.Fatal(err)
		}
		denied("node b (Calls)", method, status.FromProto(sp).Err())
	}
	// Nothing changed: no bench rank was opened, the grid still decodes,
	// and a's keys read back.
	if n := srv.Stats().Benches; n != 0 {
		t.Errorf("%d bench ranks held after the refused calls, want 0", n)
	}
	for layer := range c.Layers {
		var res engine.Result
		req := []engine.Request{{Seq: seq, Q: randVec(rng, c.QHeads*c.HeadDim)}}
		if err := e.Step(ctx, layer, req, engine.StepOptions{}, &res); err != nil {
			t.Fatalf("step after the refusals: %v", err)
		}
	}
	var keys workerv1.KeysReply
	if err := a.Invoke(ctx, workerv1.Worker_Keys_FullMethodName, calls[workerv1.Worker_Keys_FullMethodName], &keys); err != nil {
		t.Errorf("a's Keys: %v", err)
	}
	// In process: not checked, even with b's peer in the context.
	bLeaf, err := x509.ParseCertificate(bCert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pctx := peer.NewContext(ctx, &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{bLeaf}}}})
	local := srv.LocalConn(nil)
	if err := local.Invoke(pctx, workerv1.Worker_Keys_FullMethodName, calls[workerv1.Worker_Keys_FullMethodName], &keys); err != nil {
		t.Errorf("Keys in process with b's peer: %v", err)
	}
	// The check reads the peer: the same context on the server's
	// method directly (no LocalConn) is refused.
	if _, err := srv.Keys(pctx, calls[workerv1.Worker_Keys_FullMethodName].(*workerv1.KeysRequest)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Keys with b's peer, not in process: %v", err)
	}
	// a's own calls pass the check (they may fail for other reasons).
	for method, req := range calls {
		switch method {
		case workerv1.Worker_CloseGrid_FullMethodName, workerv1.Worker_Release_FullMethodName:
			continue // would end the grid for the rest of the test
		case workerv1.Worker_RunBench_FullMethodName:
			continue // would wait for peers that are not there
		}
		if err := invoke(a, method, req); status.Code(err) == codes.PermissionDenied {
			t.Errorf("node a %s: %v", method, err)
		}
		if err := invoke(legacy, method, req); status.Code(err) == codes.PermissionDenied {
			t.Errorf("role-less certificate %s: %v", method, err)
		}
	}
	// b opens grids in its own name only.
	open := func(conn grpc.ClientConnInterface, grid string) error {
		_, err := OpenGrid(ctx, []NodeRanks{{Conn: conn, Ranks: []worker.Rank{{}}}}, GridRef{Grid: grid, View: 1}, workerConfig(c))
		return err
	}
	if err := open(b, "a/7/1"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("b opens a grid in a's name: %v", err)
	}
	if err := open(b, "b/7/1"); err != nil {
		t.Errorf("b opens its own grid: %v", err)
	}
	// a's bench: a opened it above (or the role-less certificate did);
	// a closes it, and b cannot open one in a's name but may in its own.
	if _, err := workerv1.NewWorkerClient(a).CloseBench(ctx, &workerv1.CloseBenchRequest{Bench: bench}); err != nil {
		t.Errorf("a closes its bench: %v", err)
	}
	if n := srv.Stats().Benches; n != 0 {
		t.Errorf("%d bench ranks held after a closed its bench, want 0", n)
	}
	bw := workerv1.NewWorkerClient(b)
	if _, err := bw.OpenBench(ctx, &workerv1.OpenBenchRequest{Bench: BenchID("a"), Size: 2, Spec: benchSpec}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("b opens a bench in a's name: %v", err)
	}
	own := BenchID("b")
	if _, err := bw.OpenBench(ctx, &workerv1.OpenBenchRequest{Bench: own, Size: 2, Spec: benchSpec}); err != nil {
		t.Errorf("b opens its own bench: %v", err)
	}
	if _, err := bw.CloseBench(ctx, &workerv1.CloseBenchRequest{Bench: own}); err != nil {
		t.Errorf("b closes its own bench: %v", err)
	}
}

// replyOf is a new reply message of the worker method.
func replyOf(method string) proto.Message {
	switch method {
	case workerv1.Worker_OpenGrid_FullMethodName:
		return &workerv1.OpenGridReply{}
	case workerv1.Worker_ConnectGrid_FullMethodName:
		return &workerv1.ConnectGridReply{}
	case workerv1.Worker_CloseGrid_FullMethodName:
		return &workerv1.CloseGridReply{}
	case workerv1.Worker_Rollback_FullMethodName:
		return &workerv1.RollbackReply{}
	case workerv1.Worker_Layer_FullMethodName:
		return &workerv1.LayerReply{}
	case workerv1.Worker_Keys_FullMethodName:
		return &workerv1.KeysReply{}
	case workerv1.Worker_OpenBench_FullMethodName:
		return &workerv1.OpenBenchReply{}
	case workerv1.Worker_RunBench_FullMethodName:
		return &workerv1.RunBenchReply{}
	}
	return &workerv1.Ack{}
}
