package coord_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/decode/decodetest"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker/remote"
)

// TestCoordinatorStepperConformance runs the decode.Stepper suite on a
// node's coordinator over a 2-node loopback cluster (gRPC workers, CP 2
// grids spanning both nodes): on one grid, and with the sequences spread
// over two grids (one engine step per grid, the grids concurrently).
func TestCoordinatorStepperConformance(t *testing.T) {
	for _, grids := range []int{1, 2} {
		t.Run(fmt.Sprintf("grids%d", grids), func(t *testing.T) {
			decodetest.Run(t, func(t *testing.T) decodetest.Subject {
				dc, ec := seamConfig()
				nodes := nodetest.Start(t, "s", 2, ec, nil)
				return coordSubject(t, nodes[0], ec, dc, grids)
			})
		})
	}
}

// seamConfig is the suite's suggested geometry and policy on CP 2 grids
// of a loopback cluster.
func seamConfig() (decodetest.Config, engine.Config) {
	dc := decodetest.SuggestedConfig()
	ec := engine.DefaultConfig()
	ec.Layers, ec.Geometry, ec.Policy = dc.Layers, dc.Geometry, dc.Policy
	ec.CP, ec.CapacityPages, ec.Selection = 2, 64, plan.Exact
	ec.StepTimeout, ec.MemoryLimit = 2*time.Second, memlimit.NoLimit
	return dc, ec
}

// coordSubject drives nd's coordinator; its sequences go round-robin
// over grids grids (configs that differ in their pools only).
func coordSubject(t *testing.T, nd *node.Node, ec engine.Config, dc decodetest.Config, grids int) decodetest.Subject {
	co := nd.Coordinator()
	var mu sync.Mutex
	n := 0
	return handleSubject(co, dc,
		func(ctx context.Context) (string, error) {
			c := ec
			mu.Lock()
			c.CapacityPages += n % grids
			n++
			mu.Unlock()
			cr, err := co.Create(ctx, plan.Striped, &c)
			return cr.ID, err
		},
		func(id string) (decode.SeqID, error) { return co.Handle(id) },
		co.Append,
		func(_ context.Context, id string) (int, error) { return co.Len(id) })
}

// handleSubject is a Subject over a runner whose sequences have string
// ids and Stepper handles: create makes a sequence, handle names it for
// the Stepper, appendTo and length act on it by id.
func handleSubject(s decode.Stepper, dc decodetest.Config, create func(context.Context) (string, error),
	handle func(string) (decode.SeqID, error), appendTo func(context.Context, string, int, []float32, []float32) error,
	length func(context.Context, string) (int, error)) decodetest.Subject {
	var mu sync.Mutex
	ids := map[decode.SeqID]string{}
	idOf := func(h decode.SeqID) string {
		mu.Lock()
		defer mu.Unlock()
		return ids[h]
	}
	return decodetest.Subject{Stepper: s, Config: dc,
		Create: func(ctx context.Context) (decode.SeqID, error) {
			id, err := create(ctx)
			if err != nil {
				return 0, err
			}
			h, err := handle(id)
			if err != nil {
				return 0, err
			}
			mu.Lock()
			ids[h] = id
			mu.Unlock()
			return h, nil
		},
		Append: func(ctx context.Context, h decode.SeqID, layer int, k, v []float32) error {
			return appendTo(ctx, idOf(h), layer, k, v)
		},
		Len: func(ctx context.Context, h decode.SeqID) (int, error) { return length(ctx, idOf(h)) },
	}
}

// TestClientStepperConformance runs the decode.Stepper suite on the Go
// client (client) over the Decode API's Steps stream of a node of
// a 2-node loopback cluster (CP 2 grids spanning both nodes), dialled at
// the coordinating node and at the other one (which relays the stream).
func TestClientStepperConformance(t *testing.T) {
	for _, at := range []int{0, 1} {
		t.Run(fmt.Sprintf("node%d", at), func(t *testing.T) {
			decodetest.Run(t, func(t *testing.T) decodetest.Subject {
				dc, ec := seamConfig()
				nodes := nodetest.Start(t, "c", 2, ec, nil)
				cl := dial(t, nodes[0])
				via := dial(t, nodes[at])
				return handleSubject(via, dc,
					func(ctx context.Context) (string, error) {
						id, _, err := cl.CreateWith(ctx, plan.Striped, remote.GridConfigProto(ec.WorkerConfig()))
						return id, err
					},
					func(id string) (decode.SeqID, error) { return via.Handle(id), nil },
					cl.Append, cl.Len)
			})
		})
	}
}

// TestCoordinatorStepPartialRefusal: when one grid of a step refuses a
// layer that the coordinator could not check (a sequence whose layers
// differ in length) while another grid runs it, the step fails
// (ErrStepFailed, wrapping the refusal's ErrBadInput) instead of
// reporting bad input with nothing changed, and later layers are
// refused; a refusal by every grid leaves the step usable.
func TestCoordinatorStepPartialRefusal(t *testing.T) {
	dc, ec := seamConfig()
	nodes := nodetest.Start(t, "p", 2, ec, nil)
	s := coordSubject(t, nodes[0], ec, dc, 2)
	ctx := t.Context()
	var ids []decode.SeqID
	kv := make([]float32, 5*dc.KVRow())
	for range 2 {
		id, err := s.Create(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for l := range dc.Layers {
			if err := s.Append(ctx, id, l, kv, kv); err != nil {
				t.Fatal(err)
			}
		}
		ids = append(ids, id)
	}
	q1, k1 := make([]float32, dc.QRow()), make([]float32, dc.KVRow())
	q2, k2 := make([]float32, 2*dc.QRow()), make([]float32, 2*dc.KVRow())
	var res decode.Result
	// Sequence 0 (grid A) gets a token in layer 0 only.
	st, err := s.Stepper.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: ids[0], New: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Layer(ctx, 0, decode.Host(q1), decode.Host(k1), decode.Host(k1), &res); err != nil {
		t.Fatal(err)
	}
	if err := st.End(ctx); err != nil {
		t.Fatal(err)
	}
	st, err = s.Stepper.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: ids[0], New: true}, {Seq: ids[1], New: true}}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.End(ctx)
	// Every grid refuses a q beyond the limit: the step goes on.
	huge := make([]float32, len(q2))
	huge[3] = 2 * decode.MagnitudeLimit(dc.HeadDim)
	if err := st.Layer(ctx, 0, decode.Host(huge), decode.Host(k2), decode.Host(k2), &res); !errors.Is(err, decode.ErrBadInput) || errors.Is(err, decode.ErrStepFailed) {
		t.Fatalf("layer 0 with q beyond the limit: %v, want bad input, the step usable", err)
	}
	if err := st.Layer(ctx, 0, decode.Host(q2), decode.Host(k2), decode.Host(k2), &res); err != nil {
		t.Fatalf("layer 0: %v", err)
	}
	// Layer 1: grid A refuses sequence 0 (5 tokens there, 6 in layer 0),
	// grid B runs sequence 1.
	err = st.Layer(ctx, 1, decode.Host(q2), decode.Host(k2), decode.Host(k2), &res)
	if !errors.Is(err, decode.ErrStepFailed) || !errors.Is(err, decode.ErrBadInput) {
		t.Fatalf("layer 1, refused by one grid and run by the other: %v, want ErrStepFailed wrapping ErrBadInput", err)
	}
	if err := st.Layer(ctx, 2, decode.Host(q2), decode.Host(k2), decode.Host(k2), &res); !errors.Is(err, decode.ErrStepFailed) {
		t.Fatalf("layer 2 after the failure: %v, want ErrStepFailed", err)
	}
}

// TestClientBeginRefusedAhead: the Go client sends a step's begin and its
// first layer without waiting in between, so the coordinator's refusal
// of the step (here dense layers beyond the model, which only the
// coordinator checks) comes back at the first Layer call: the same
// class (decode.ErrBadInput) and words as the in-process coordinator's
// Begin refusal, wrapped in decode.ErrBeginRefused, not ErrStepFailed;
// the sequence's length is unchanged, the later Layer calls of that step
// fail, and the next good step (on a fresh stream) runs.
func TestClientBeginRefusedAhead(t *testing.T) {
	dc, ec := seamConfig()
	nodes := nodetest.Start(t, "r", 2, ec, nil)
	cl := dial(t, nodes[0])
	co := nodes[0].Coordinator()
	ctx := t.Context()
	id, _, err := cl.CreateWith(ctx, plan.Striped, remote.GridConfigProto(ec.WorkerConfig()))
	if err != nil {
		t.Fatal(err)
	}
	kv := make([]float32, 5*dc.KVRow())
	for i := range kv {
		kv[i] = float32(i%7) / 7
	}
	for l := range dc.Layers {
		if err := cl.Append(ctx, id, l, kv, kv); err != nil {
			t.Fatal(err)
		}
	}
	q, k := make([]float32, dc.QRow()), kv[:dc.KVRow()]
	good := func() {
		t.Helper()
		st, err := cl.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: cl.Handle(id), New: true}}})
		if err != nil {
			t.Fatal(err)
		}
		var res decode.Result
		for l := range dc.Layers {
			if err := st.Layer(ctx, l, decode.Host(q), decode.Host(k), decode.Host(k), &res); err != nil {
				t.Fatalf("layer %d: %v", l, err)
			}
		}
		if err := st.End(ctx); err != nil {
			t.Fatal(err)
		}
	}
	length := func() int {
		t.Helper()
		n, err := cl.Len(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	good() // the stream is kept: the bad step's begin goes out on it
	before := length()
	bad := decode.Row{New: true, DenseLayers: dc.Layers + 1}
	h, err := co.Handle(id)
	if err != nil {
		t.Fatal(err)
	}
	bad.Seq = h
	_, want := co.Begin(ctx, decode.Batch{Rows: []decode.Row{bad}})
	if !errors.Is(want, decode.ErrBadInput) {
		t.Fatalf("in process: %v, want bad input", want)
	}
	bad.Seq = cl.Handle(id)
	st, err := cl.Begin(ctx, decode.Batch{Rows: []decode.Row{bad}})
	if err != nil {
		t.Fatalf("client Begin: %v (the refusal should come with the first layer)", err)
	}
	var res decode.Result
	got := st.Layer(ctx, 0, decode.Host(q), decode.Host(k), decode.Host(k), &res)
	switch {
	case !errors.Is(got, decode.ErrBeginRefused) || !errors.Is(got, decode.ErrBadInput) || errors.Is(got, decode.ErrStepFailed):
		t.Fatalf("first layer: %v, want decode.ErrBeginRefused and ErrBadInput, not ErrStepFailed", got)
	case !strings.Contains(got.Error(), want.Error()):
		t.Errorf("first layer: %q\ndoes not say what the coordinator says in process: %q", got, want)
	}
	t.Logf("in process: %v\nthrough the client: %v", want, got)
	if err := st.Layer(ctx, 1, decode.Host(q), decode.Host(k), decode.Host(k), &res); !errors.Is(err, decode.ErrStepFailed) {
		t.Errorf("a later layer of the refused step: %v, want ErrStepFailed", err)
	}
	if err := st.End(ctx); err != nil {
		t.Errorf("end of the refused step: %v", err)
	}
	if n := length(); n != before {
		t.Fatalf("length %d after the refused step, %d before", n, before)
	}
	good()
	if n := length(); n != before+1 {
		t.Fatalf("length %d after a good step, want %d", n, before+1)
	}
}
