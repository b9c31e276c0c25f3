package remote

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// hookConn runs before ahead of the first call of method.
type hookConn struct {
	grpc.ClientConnInterface
	method string
	once   sync.Once
	before func()
}

func (h *hookConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if method == h.method {
		h.once.Do(h.before)
	}
	return h.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
}

// NewStream hooks the calls of a Calls stream (a decode step's BeginStep,
// Layer and EndStep) as Invoke hooks unary ones.
func (h *hookConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := h.ClientConnInterface.NewStream(ctx, desc, method, opts...)
	if err != nil || method != workerv1.Worker_Calls_FullMethodName {
		return s, err
	}
	return &hookStream{ClientStream: s, h: h}, nil
}

type hookStream struct {
	grpc.ClientStream
	h *hookConn
}

func (s *hookStream) SendMsg(m any) error {
	if c, ok := m.(*workerv1.Call); ok && c.GetMethod() == s.h.method {
		s.h.once.Do(s.h.before)
	}
	return s.ClientStream.SendMsg(m)
}

// TestNodeLost stops one of three nodes (its grpc.Server and its Server)
// between steps, and another just as a step's Layer call is sent to it:
// the step fails promptly, well inside the 2 s step deadline, with an
// error that wraps ErrUnavailable; the engine stays usable for its error
// path, and the survivors' goroutines are gone after Close (goleak in
// TestMain).
func TestNodeLost(t *testing.T) {
	for _, midLayer := range []bool{false, true} {
		name := map[bool]string{false: "between_steps", true: "mid_layer"}[midLayer]
		t.Run(name, func(t *testing.T) {
			nodes := startNodes(t, 3, DefaultServerConfig())
			c := engineConfig(3, 2, plan.Exact)
			c.StepTimeout = 2 * time.Second
			cs := conns(nodes)
			if midLayer {
				cs[2] = &hookConn{ClientConnInterface: nodes[2].conn, method: workerv1.Worker_Layer_FullMethodName, before: nodes[2].stop}
			}
			e, _ := openRemote(t, c, spread(c, cs, 0), "lost-"+name)
			rng := rand.New(rand.NewPCG(3, 4))
			seq, err := e.Create(plan.Striped)
			if err != nil {
				t.Fatal(err)
			}
			tok := c.KVHeads * c.HeadDim
			for layer := range c.Layers {
				if err := e.Append(seq, layer, randVec(rng, 44*tok), randVec(rng, 44*tok)); err != nil {
					t.Fatal(err)
				}
			}
			req := func() []engine.Request {
				return []engine.Request{{Seq: seq, Q: randVec(rng, c.QHeads*c.HeadDim), K: randVec(rng, tok), V: randVec(rng, tok)}}
			}
			var res engine.Result
			if !midLayer {
				if err := e.Step(context.Background(), 0, req(), engine.StepOptions{}, &res); err != nil {
					t.Fatal(err)
				}
				nodes[2].stop()
			}
			start := time.Now()
			err = e.Step(context.Background(), 1, req(), engine.StepOptions{}, &res)
			took := time.Since(start)
			if err == nil {
				t.Fatal("step over a lost node succeeded")
			}
			if !errors.Is(err, ErrUnavailable) {
				t.Errorf("error does not wrap ErrUnavailable (code %v): %v", status.Code(err), err)
			}
			if took > c.StepTimeout {
				t.Errorf("step took %v, past its %v deadline", took, c.StepTimeout)
			}
			t.Logf("failed in %v: %v", took.Round(time.Millisecond), err)
			if _, err := e.Len(seq); midLayer && !errors.Is(err, engine.ErrBroken) {
				// The lost node never answered: the token its rank (cp 2 owns
				// page 11) should take may or may not be in.
				t.Errorf("sequence not broken after a Layer call without an answer: %v", err)
			}
			// The survivors answer and the lost node does not.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			for i, n := range nodes {
				_, err := workerv1.NewWorkerClient(n.conn).Release(ctx, &workerv1.ReleaseRequest{Ref: &workerv1.GridRef{Grid: "lost-" + name, View: 1}, Seq: 12345})
				want := codes.NotFound
				if i == 2 {
					want = codes.Unavailable
				}
				if status.Code(err) != want {
					t.Errorf("node %d: %v, want %v", i, err, want)
				}
			}
		})
	}
}

// TestGridLifecycle covers a grid that never gets its ConnectGrid (freed
// after ConnectTimeout), a node over its page bound (OpenGrid fails and
// the other node's grid is closed again), grid calls out of order, and
// idempotent CloseGrid.
func TestGridLifecycle(t *testing.T) {
	cfg := DefaultServerConfig()
	// Short enough to see a grid never connected freed, long enough for
	// the grids below to connect on a loaded machine (100 ms was not:
	// "waiting for ranks [1] to connect" under CI load).
	cfg.ConnectTimeout = time.Second
	cfg.MaxPages = 300
	nodes := startNodes(t, 2, cfg)
	c := engineConfig(2, 1, plan.Exact)
	wc := workerConfig(c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gc, err := encodeConfig(wc)
	if err != nil {
		t.Fatal(err)
	}
	api := workerv1.NewWorkerClient(nodes[0].conn)
	ref := &workerv1.GridRef{Grid: "stale", View: 3}

	// Never connected: freed once ConnectTimeout passed.
	if _, err := api.OpenGrid(ctx, &workerv1.OpenGridRequest{Ref: ref, Config: gc, Ranks: []*workerv1.Rank{{Cp: 0}}}); err != nil {
		t.Fatal(err)
	}
	if st := nodes[0].srv.Stats(); st.Grids != 1 || st.PagesUsed != 256 || st.PagesFree != 44 {
		t.Fatalf("after OpenGrid: %+v", st)
	}
	_, err = api.OpenGrid(ctx, &workerv1.OpenGridRequest{Ref: ref, Config: gc, Ranks: []*workerv1.Rank{{Cp: 1}}})
	if status.Code(err) != codes.FailedPrecondition || !errors.Is(FromStatus(err), ErrGridState) {
		t.Errorf("second OpenGrid: %v", err)
	}
	_, err = api.Create(ctx, &workerv1.CreateRequest{Ref: ref, Seq: 1, Layout: &workerv1.Layout{Cp: 2, Tp: 1}})
	if !errors.Is(FromStatus(err), ErrGridState) {
		t.Errorf("Create before ConnectGrid: %v", err)
	}
	// Freed by a timer at ConnectTimeout: polled, not slept on (a fixed
	// twice ConnectTimeout leaves a starved timer goroutine 1 s).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st := nodes[0].srv.Stats()
		if st.Grids == 0 && st.PagesUsed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a grid never connected was not freed in 20 s (ConnectTimeout %v): %+v", cfg.ConnectTimeout, st)
		}
	}
	_, err = api.ConnectGrid(ctx, &workerv1.ConnectGridRequest{Ref: ref, Peers: []string{"127.0.0.1:1", "127.0.0.1:2"}})
	if status.Code(err) != codes.NotFound || !errors.Is(FromStatus(err), ErrUnknownGrid) {
		t.Errorf("ConnectGrid after the timeout: %v", err)
	}

	// Node 1 cannot take two ranks of 256 pages: OpenGrid fails and
	// node 0's part is closed again.
	nr := []NodeRanks{{Conn: nodes[0].conn, Ranks: []worker.Rank{{CP: 0}}}, {Conn: nodes[1].conn, Ranks: []worker.Rank{{CP: 1}}}}
	c1 := c
	c1.CP = 3
	nr3 := append(nr[:1:1], NodeRanks{Conn: nodes[1].conn, Ranks: []worker.Rank{{CP: 1}, {CP: 2}}})
	_, err = OpenGrid(ctx, nr3, GridRef{Grid: "full", View: 1}, workerConfig(c1))
	if !errors.Is(err, ErrNodeFull) || status.Code(err) != codes.ResourceExhausted {
		t.Errorf("OpenGrid over MaxPages: code %v: %v", status.Code(err), err)
	}
	// It says the node is full and what was asked, not the node's bound
	// (MaxPages) nor what its other grids reserve.
	if msg := err.Error(); strings.Contains(msg, strconv.Itoa(cfg.MaxPages)) || strings.Contains(msg, "reserved") || !strings.Contains(msg, "2 ranks of 256 pages") {
		t.Errorf("OpenGrid over MaxPages: message %q discloses the node's state or omits the request", msg)
	}
	for i, n := range nodes {
		if g := n.srv.Grids(); g != 0 {
			t.Errorf("node %d holds %d grids after a failed OpenGrid", i, g)
		}
	}

	// A grid that opens and closes; CloseGrid twice is fine; a wrong
	// view does not close it.
	clients, err := OpenGrid(ctx, nr, GridRef{Grid: "ok", View: 1}, wc)
	if err != nil {
		t.Fatal(err)
	}
	if err := CloseGrid(ctx, NewClient(nodes[0].conn, GridRef{Grid: "ok", View: 9}, wc)); !errors.Is(err, ErrWrongView) {
		t.Errorf("CloseGrid with a wrong view: %v", err)
	}
	if err := CloseGrid(ctx, clients...); err != nil {
		t.Fatal(err)
	}
	if err := CloseGrid(ctx, clients...); err != nil {
		t.Fatalf("second CloseGrid: %v", err)
	}
	if err := clients[0].Create(ctx, worker.CreateRequest{Seq: 1, Layout: plan.Layout{CP: 2, TP: 1}}); !errors.Is(err, ErrUnknownGrid) {
		t.Errorf("Create on a closed grid: %v", err)
	}
	// A grid left open is closed by Server.Close (cleanup).
	if _, err := OpenGrid(ctx, nr, GridRef{Grid: "left", View: 1}, wc); err != nil {
		t.Fatal(err)
	}
}
