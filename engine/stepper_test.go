package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/decode/decodetest"
	"github.com/questrt/questrt/plan"
)

// TestStepperConformance runs the decode.Stepper suite on the in-process
// engine over CP x TP layouts and both exact selection modes, with both
// GQA modes: every layout equals the host reference.
func TestStepperConformance(t *testing.T) {
	for _, l := range []struct {
		cp, tp int
		sel    Selection
		gqa    plan.GQAMode
	}{
		{1, 1, Exact, plan.GroupMax}, {1, 1, Exact, plan.PerHead}, {2, 1, Exact, plan.GroupMax},
		{3, 2, Exact, plan.PerHead}, {2, 2, Replicated, plan.GroupMax},
	} {
		t.Run(fmt.Sprintf("cp%d-tp%d-%v-%v", l.cp, l.tp, l.sel, l.gqa), func(t *testing.T) {
			decodetest.Run(t, func(t *testing.T) decodetest.Subject {
				dc := decodetest.SuggestedConfig()
				dc.Policy.GQA = l.gqa
				cfg := DefaultConfig()
				cfg.Layers, cfg.Geometry, cfg.Policy = dc.Layers, dc.Geometry, dc.Policy
				cfg.CP, cfg.TP, cfg.Selection, cfg.CapacityPages = l.cp, l.tp, l.sel, 64
				e, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { e.Close() })
				return decodetest.Subject{Stepper: e, Config: dc,
					Create: func(context.Context) (decode.SeqID, error) { return e.Create(plan.Striped) },
					Append: func(_ context.Context, id decode.SeqID, layer int, k, v []float32) error {
						return e.Append(id, layer, k, v)
					},
					Len: func(_ context.Context, id decode.SeqID) (int, error) { return e.Len(id) },
				}
			})
		})
	}
}

// TestSeqOpsTakeContext: the sequence operations (append, fork,
// rollback, release, create) wait for an open step only as long as their
// context lets them, return its deadline and change nothing; a done
// context stops an append before it reaches a worker.
func TestSeqOpsTakeContext(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize, cfg.CP = 2, 4, 2, 8, 4, 2
	cfg.Policy.PageSize, cfg.CapacityPages = 4, 32
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	id, err := e.CreateContext(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	kv := make([]float32, 3*cfg.KVRow())
	for l := range cfg.Layers {
		if err := e.AppendContext(ctx, id, l, kv, kv); err != nil {
			t.Fatal(err)
		}
	}
	st, err := e.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: id}}})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	err = e.AppendContext(short, id, 0, kv, kv)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("append while a step is open: %v, want the context's deadline", err)
	}
	short, cancel = context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	for name, op := range map[string]func() error{
		"fork":     func() error { _, err := e.ForkContext(short, id); return err },
		"rollback": func() error { return e.RollbackContext(short, id, 1) },
		"release":  func() error { return e.ReleaseContext(short, id) },
		"create":   func() error { _, err := e.CreateContext(short, plan.Striped); return err },
	} {
		if err := op(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s while a step is open: %v, want the context's deadline", name, err)
		}
	}
	if err := st.End(ctx); err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := e.AppendContext(done, id, 0, kv, kv); !errors.Is(err, context.Canceled) {
		t.Fatalf("append with a done context: %v, want context.Canceled", err)
	}
	if n, err := e.Len(id); err != nil || n != 3 {
		t.Fatalf("length %d (%v) after refused operations, want 3", n, err)
	}
	if _, err := e.Len(id + 1); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("a sequence created while the step was open: %v, want unknown", err)
	}
	if err := e.AppendContext(ctx, id, 0, kv, kv); err != nil {
		t.Fatalf("append after End: %v", err)
	}
}

// TestStepLayersBound: decode.Batch.Layers bounds a step: a step of one
// layer runs that layer and refuses the next with ErrBadInput, the step
// staying usable to End; a Layers past the model is refused in Begin.
func TestStepLayersBound(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 3, 4, 2, 8, 4
	cfg.Policy.PageSize, cfg.CapacityPages = 4, 32
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	id, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []decode.Batch{{FirstLayer: 1, Layers: 3}, {FirstLayer: 0, Layers: -1}} {
		b.Rows = []decode.Row{{Seq: id, New: true}}
		if _, err := e.Begin(ctx, b); !errors.Is(err, decode.ErrBadInput) {
			t.Fatalf("layers %d from %d: %v, want ErrBadInput", b.Layers, b.FirstLayer, err)
		}
	}
	st, err := e.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: id, New: true}}, FirstLayer: 1, Layers: 1})
	if err != nil {
		t.Fatal(err)
	}
	q, kv := make([]float32, cfg.QRow()), make([]float32, cfg.KVRow())
	q[0], kv[0] = 1, 1
	var res decode.Result
	if err := st.Layer(ctx, 1, decode.Host(q), decode.Host(kv), decode.Host(kv), &res); err != nil {
		t.Fatal(err)
	}
	if err := st.Layer(ctx, 2, decode.Host(q), decode.Host(kv), decode.Host(kv), &res); !errors.Is(err, decode.ErrBadInput) {
		t.Fatalf("layer 2 of a step of layer 1: %v, want ErrBadInput", err)
	}
	if err := st.End(ctx); err != nil {
		t.Fatal(err)
	}
	// Layer 1 holds the token, the others none.
	for l, want := range []int{0, 1, 0} {
		if n := e.seqs[id].lens[l]; n != want {
			t.Fatalf("layer %d holds %d tokens, want %d", l, n, want)
		}
	}
}
