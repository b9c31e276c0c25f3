package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// startNodesWithoutCalls starts n nodes whose gRPC servers lack the
// Calls method (as a node of an older version): their clients fall back
// to unary calls.
func startNodesWithoutCalls(t testing.TB, n int) []*node {
	t.Helper()
	cfg := DefaultServerConfig()
	cfg.Plaintext = true
	desc := workerv1.Worker_ServiceDesc
	desc.Streams = nil
	var out []*node
	for range n {
		srv, err := NewServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		gs.RegisterService(&desc, srv)
		go gs.Serve(lis) // ends with Stop
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		nd := &node{srv: srv, gs: gs, conn: conn}
		t.Cleanup(func() { conn.Close(); nd.stop() })
		out = append(out, nd)
	}
	return out
}

// TestTransportsAgree runs the equivalence workload (appends, decode
// steps with and without new tokens, a fork, a rollback, phased and
// diagnostics steps, a release) on engines whose workers are reached
// over each of the worker transports, against the in-process engine:
// every step's calls on a Calls stream (the default), unary calls (nodes
// without the Calls method), and node 0 in process (LocalConn, as a
// coordinator reaches its own node) with the others over gRPC.
func TestTransportsAgree(t *testing.T) {
	streams := startNodes(t, 3, DefaultServerConfig())
	old := startNodesWithoutCalls(t, 3)
	mixed := conns(streams)
	mixed[0] = streams[0].srv.LocalConn(streams[0].conn)
	setups := []struct {
		name  string
		conns []grpc.ClientConnInterface
	}{
		{"calls_streams", conns(streams)},
		{"unary_fallback", conns(old)},
		{"local_node0", mixed},
	}
	for si, s := range setups {
		for ci, tc := range []struct {
			cp, tp int
			mode   plan.SelectMode
		}{{2, 2, plan.Exact}, {3, 1, plan.Replicated}} {
			name := fmt.Sprintf("%s/cp%d_tp%d_%v", s.name, tc.cp, tc.tp, tc.mode)
			t.Run(name, func(t *testing.T) {
				c := engineConfig(tc.cp, tc.tp, tc.mode)
				ref, err := engine.New(c)
				if err != nil {
					t.Fatal(err)
				}
				defer ref.Close()
				rem, clients := openRemote(t, c, spread(c, s.conns, ci), fmt.Sprintf("tr-%d-%d", si, ci))
				w := &twin{t: t, c: c, ref: ref, rem: rem, rng: rand.New(rand.NewPCG(uint64(ci), 11)), identical: true}
				a := w.create(plan.Striped)
				b := w.create(plan.Contiguous)
				w.fill(a, 120)
				w.fill(b, 90)
				for range 3 {
					w.decode([]engine.SeqID{a, b}, true, engine.StepOptions{})
				}
				w.decode([]engine.SeqID{b, a}, false, engine.StepOptions{})
				ch := w.fork(a)
				w.decode([]engine.SeqID{a, ch}, true, engine.StepOptions{})
				w.rollback(b, 5)
				w.decode([]engine.SeqID{b, ch}, true, engine.StepOptions{Phased: true})
				w.decode([]engine.SeqID{a, b, ch}, true, engine.StepOptions{Diagnostics: true})
				w.release(ch)
				w.sameLen(a, b)
				for i, cl := range clients {
					_, local := cl.calls.cc.(*localConn)
					if want := s.name == "unary_fallback" || local; cl.calls.unary != want {
						t.Errorf("node %d: unary calls %v, want %v", i, cl.calls.unary, want)
					}
				}
				if !w.identical {
					t.Errorf("outputs not bit-identical to the in-process engine (largest relative difference %.3g)", w.maxRel)
				}
			})
		}
	}
}

// TestTransportsAnswerAlike: a call that fails answers the same status
// (code, message, details) whether it went as a unary call, on a Calls
// stream or in process (LocalConn); a Calls stream goes on after a
// failed call.
func TestTransportsAnswerAlike(t *testing.T) {
	nodes := startNodes(t, 2, DefaultServerConfig())
	c := engineConfig(2, 1, plan.Exact)
	nr := []NodeRanks{{Conn: nodes[0].conn, Ranks: []worker.Rank{{TP: 0, CP: 0}}}, {Conn: nodes[1].conn, Ranks: []worker.Rank{{TP: 0, CP: 1}}}}
	e, _ := openRemote(t, c, nr, "alike")
	seq, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	good := &workerv1.GridRef{Grid: "alike", View: 1}
	cases := []struct {
		name     string
		method   string
		req      proto.Message
		reply    func() proto.Message
		sentinel error
	}{
		{"begin on an unknown grid", workerv1.Worker_BeginStep_FullMethodName,
			&workerv1.BeginRequest{Ref: &workerv1.GridRef{Grid: "nope", View: 1}, Step: 1 << 40}, func() proto.Message { return new(workerv1.Ack) }, ErrUnknownGrid},
		{"begin under another view", workerv1.Worker_BeginStep_FullMethodName,
			&workerv1.BeginRequest{Ref: &workerv1.GridRef{Grid: "alike", View: 7}, Step: 1 << 40}, func() proto.Message { return new(workerv1.Ack) }, ErrWrongView},
		{"begin of an unknown sequence", workerv1.Worker_BeginStep_FullMethodName,
			&workerv1.BeginRequest{Ref: good, Step: 1 << 40, Seqs: []*workerv1.StepSeq{{Seq: uint64(seq) + 99}}}, func() proto.Message { return new(workerv1.Ack) }, worker.ErrUnknownSequence},
		{"layer of no open step", workerv1.Worker_Layer_FullMethodName,
			&workerv1.LayerRequest{Ref: good, Step: 1 << 41, Layer: 1}, func() proto.Message { return new(workerv1.LayerReply) }, nil},
		{"end on an unknown grid", workerv1.Worker_EndStep_FullMethodName,
			&workerv1.EndRequest{Ref: &workerv1.GridRef{Grid: "nope", View: 1}, Step: 1}, func() proto.Message { return new(workerv1.Ack) }, ErrUnknownGrid},
	}
	cs := newCallStream(nodes[0].conn, 0)
	local := nodes[0].srv.LocalConn(nil)
	for _, tc := range cases {
		errUnary := nodes[0].conn.Invoke(ctx, tc.method, tc.req, tc.reply())
		errStream := cs.invoke(ctx, tc.method, tc.req, tc.reply())
		errLocal := local.Invoke(ctx, tc.method, tc.req, tc.reply())
		if errUnary == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		want := status.Convert(errUnary).Proto()
		for _, got := range []struct {
			how string
			err error
		}{{"calls stream", errStream}, {"in process", errLocal}} {
			if !proto.Equal(status.Convert(got.err).Proto(), want) {
				t.Errorf("%s: %s answered %v, unary %v", tc.name, got.how, got.err, errUnary)
			}
			if tc.sentinel != nil && !errors.Is(FromStatus(got.err), tc.sentinel) {
				t.Errorf("%s: %s: %v does not wrap %v", tc.name, got.how, got.err, tc.sentinel)
			}
		}
	}
	if cs.s == nil {
		t.Errorf("the Calls stream ended after answers that were errors")
	}
	cs.drop()
	// The engine still steps over the grid.
	var res engine.Result
	rng := rand.New(rand.NewPCG(5, 6))
	tok := c.KVHeads * c.HeadDim
	for layer := range c.Layers {
		if err := e.Append(seq, layer, randVec(rng, 20*tok), randVec(rng, 20*tok)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Step(ctx, 1, []engine.Request{{Seq: seq, Q: randVec(rng, c.QHeads*c.HeadDim)}}, engine.StepOptions{}, &res); err != nil {
		t.Fatal(err)
	}
}

// TestCallsStreamDeadline: a Layer call whose context ends while the node
// runs it (rank 0 waits for rank 1, which never got its Layer) answers
// DEADLINE_EXCEEDED at the deadline, as a unary call does (the node's
// answer, or the client's own when it cuts the Calls stream first); the
// step's EndStep and a later step work.
func TestCallsStreamDeadline(t *testing.T) {
	nodes := startNodes(t, 2, DefaultServerConfig())
	c := engineConfig(2, 1, plan.Exact)
	nr := []NodeRanks{{Conn: nodes[0].conn, Ranks: []worker.Rank{{TP: 0, CP: 0}}}, {Conn: nodes[1].conn, Ranks: []worker.Rank{{TP: 0, CP: 1}}}}
	e, clients := openRemote(t, c, nr, "deadline")
	seq, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	tok := c.KVHeads * c.HeadDim
	const n = 30
	for layer := range c.Layers {
		if err := e.Append(seq, layer, randVec(rng, n*tok), randVec(rng, n*tok)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	step := uint64(1 << 40)
	for _, cl := range clients {
		if err := cl.BeginStep(ctx, worker.BeginRequest{Step: step, Layer: 1, Seqs: []worker.StepSeq{{Seq: uint64(seq), Len: n}}}); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	start := time.Now()
	var rep worker.LayerReply
	err = clients[0].Layer(short, worker.LayerRequest{Step: step, Layer: 1,
		Ranks: []worker.RankInput{{Rank: worker.Rank{}, Q: randVec(rng, c.QHeads*c.HeadDim)}}}, &rep)
	took := time.Since(start)
	cancel()
	if status.Code(err) != codes.DeadlineExceeded && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("layer past its deadline: %v (code %v), want DEADLINE_EXCEEDED", err, status.Code(err))
	}
	if took > 2*time.Second {
		t.Errorf("layer past its 100ms deadline returned after %v", took)
	}
	for _, cl := range clients {
		if err := cl.EndStep(ctx, worker.EndRequest{Step: step, Failed: true, Layers: []int{1}}); err != nil {
			t.Fatalf("end step: %v", err)
		}
		if cl.calls.s == nil {
			t.Errorf("no Calls stream kept after EndStep for the next step")
		}
	}
	kept := []any{clients[0].calls.s, clients[1].calls.s}
	// The next step runs on both ranks.
	step++
	for _, cl := range clients {
		if err := cl.BeginStep(ctx, worker.BeginRequest{Step: step, Layer: 1, Seqs: []worker.StepSeq{{Seq: uint64(seq), Len: n}}}); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Go(func() {
			var rep worker.LayerReply
			errs[i] = cl.Layer(ctx, worker.LayerRequest{Step: step, Layer: 1,
				Ranks: []worker.RankInput{{Rank: nr[i].Ranks[0], Q: randVec(rand.New(rand.NewPCG(9, 9)), c.QHeads*c.HeadDim)}}}, &rep)
		})
	}
	wg.Wait()
	for i, cl := range clients {
		if errs[i] != nil {
			t.Errorf("rank %d: a layer after the timed-out one: %v", i, errs[i])
		}
		if err := cl.EndStep(ctx, worker.EndRequest{Step: step}); err != nil {
			t.Fatal(err)
		}
		if cl.calls.s != kept[i] {
			t.Errorf("rank %d: the next step opened another Calls stream", i)
		}
	}
}

// TestCallsStreamEndedBetweenSteps: a kept Calls stream that the node
// ended between steps (here: a call marked last, which the node answers
// and then ends the stream with OK) costs the next step nothing: its
// first call goes out on a fresh stream. (The calls end no open step:
// the node's answer, FAILED_PRECONDITION, is what shows that they ran.)
func TestCallsStreamEndedBetweenSteps(t *testing.T) {
	nodes := startNodes(t, 1, DefaultServerConfig())
	c := engineConfig(1, 1, plan.Exact)
	nr := []NodeRanks{{Conn: nodes[0].conn, Ranks: []worker.Rank{{TP: 0, CP: 0}}}}
	_, clients := openRemote(t, c, nr, "ended")
	cs := newCallStream(nodes[0].conn, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	end := func(step uint64) *workerv1.EndRequest {
		return &workerv1.EndRequest{Ref: clients[0].ref, Step: step}
	}
	ran := func(err error) bool { return status.Code(err) == codes.FailedPrecondition }
	if err := cs.invoke(ctx, workerv1.Worker_EndStep_FullMethodName, end(1), new(workerv1.Ack)); !ran(err) {
		t.Fatal(err)
	}
	s := cs.s
	req, err := proto.Marshal(end(2))
	if err != nil {
		t.Fatal(err)
	}
	// The node answers a last call, then ends the stream.
	if err := s.Send(&workerv1.Call{Method: workerv1.Worker_EndStep_FullMethodName, Request: req, Last: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("the stream after a last call: %v, want its end (EOF)", err)
	}
	if err := cs.invoke(ctx, workerv1.Worker_EndStep_FullMethodName, end(3), new(workerv1.Ack)); !ran(err) {
		t.Fatalf("a call on the ended stream: %v, want it run on a fresh one", err)
	}
	if cs.s == nil || cs.s == s {
		t.Errorf("no fresh stream after the kept one ended")
	}
	cs.close()
}
