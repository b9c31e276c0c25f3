// Package decodetest is the conformance suite of decode.Stepper (in the
// style of testing/fstest and kernels/backendtest): Run checks a runner
// against Reference, an independent host reference, and the seam's rules
// for bad input, and reports every violation.
package decodetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/plan"
)

// Subject is a runner under test: its Stepper, the sequence operations
// the suite needs to lay data out, and its geometry and policy.
type Subject struct {
	Stepper decode.Stepper
	Config  Config
	// Create adds an empty sequence.
	Create func(ctx context.Context) (decode.SeqID, error)
	// Append appends tokens ([n][KVHeads][HeadDim]) to one layer.
	Append func(ctx context.Context, id decode.SeqID, layer int, k, v []float32) error
	// Len returns the tokens every layer of the sequence holds.
	Len func(ctx context.Context, id decode.SeqID) (int, error)
	// Tol is the tolerance on outputs and LSE against the reference:
	// |got - want| <= Tol x (1 + |want|) (default 1e-4).
	Tol float64
	// Tensors, when set, is device memory the Stepper takes in place:
	// the suite then runs its unphased steps with q, k, v and the
	// outputs in it (one output tensor per layer, read back after End),
	// and checks the outputs and plans, not the LSE (a device step does
	// not return it).
	Tensors Tensors
}

// Tensors is device memory a test can fill and read back (for example
// kernels/backendtest.QueuedDevice).
type Tensors interface {
	// AllocTensor returns a device tensor of n elements.
	AllocTensor(n int) (decode.Tensor, error)
	// UploadTensor copies src into t, in the order of the work queued so
	// far.
	UploadTensor(t decode.Tensor, src []float32) error
	// DownloadTensor waits for the queued work and copies t out.
	DownloadTensor(ctx context.Context, t decode.Tensor) ([]float32, error)
}

// SuggestedConfig is a small geometry and policy that makes every
// kind of plan appear within a few dozen tokens: 3 layers (the first
// dense), 4 query heads over 2 KV heads of 8, pages of 4 tokens, a
// budget of 3 pages with one sink and one local page.
func SuggestedConfig() Config {
	p := plan.DefaultPolicy()
	p.PageSize, p.BudgetTokens, p.SinkPages, p.LocalPages, p.DenseLayers = 4, 12, 1, 1, 1
	return Config{Layers: 3, Geometry: plan.Geometry{QHeads: 4, KVHeads: 2, HeadDim: 8, PageSize: 4}, Policy: p}
}

// Run runs the suite on a fresh subject per test; newSubject builds it
// (on t, which it may use for cleanups).
func Run(t *testing.T, newSubject func(t *testing.T) Subject) {
	t.Run("MatchesReference", func(t *testing.T) { matchesReference(t, newSubject(t)) })
	t.Run("BadBegin", func(t *testing.T) { badBegin(t, newSubject(t)) })
	t.Run("BadLayer", func(t *testing.T) { badLayer(t, newSubject(t)) })
	t.Run("StepOpen", func(t *testing.T) { stepOpen(t, newSubject(t)) })
}

// world is a subject and a reference holding the same sequences.
type world struct {
	t    *testing.T
	s    Subject
	ref  *Reference
	ids  []decode.SeqID // the subject's
	rids []decode.SeqID // the reference's
	rng  *rand.Rand
}

// newWorld creates one sequence per prompt length in both, with the
// same random tokens in every layer.
func newWorld(t *testing.T, s Subject, lens ...int) *world {
	t.Helper()
	ctx := context.Background()
	w := &world{t: t, s: s, ref: NewReference(s.Config), rng: rand.New(rand.NewPCG(7, uint64(len(lens))))}
	for _, n := range lens {
		id, err := s.Create(ctx)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		rid, _ := w.ref.Create(ctx)
		w.ids, w.rids = append(w.ids, id), append(w.rids, rid)
		if n == 0 {
			continue
		}
		for l := range s.Config.Layers {
			k, v := w.randn(n*s.Config.KVRow()), w.randn(n*s.Config.KVRow())
			if err := s.Append(ctx, id, l, k, v); err != nil {
				t.Fatalf("append %d tokens to layer %d: %v", n, l, err)
			}
			if err := w.ref.Append(ctx, rid, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	return w
}

// upload returns a device tensor holding x (the zero Tensor for none).
func (w *world) upload(x []float32) decode.Tensor {
	if len(x) == 0 {
		return decode.Tensor{}
	}
	t := w.alloc(len(x))
	if err := w.s.Tensors.UploadTensor(t, x); err != nil {
		w.t.Fatalf("upload: %v", err)
	}
	return t
}

// alloc returns a device tensor of n elements.
func (w *world) alloc(n int) decode.Tensor {
	t, err := w.s.Tensors.AllocTensor(n)
	if err != nil {
		w.t.Fatalf("alloc: %v", err)
	}
	return t
}

func (w *world) randn(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(w.rng.NormFloat64())
	}
	return x
}

// step runs one step over every layer on both (rows index w.ids) and
// compares the outputs, LSE and plans of every layer.
func (w *world) step(rows []decode.Row, opt decode.Options) { w.stepFrom(0, rows, opt) }

// stepFrom is step from layer first to the last.
func (w *world) stepFrom(first int, rows []decode.Row, opt decode.Options) {
	t, c := w.t, w.s.Config
	t.Helper()
	ctx := context.Background()
	rrows := make([]decode.Row, len(rows))
	for i, r := range rows {
		rrows[i] = r
		rrows[i].Seq = w.rids[r.Seq]
		rows[i].Seq = w.ids[r.Seq]
	}
	b := decode.Batch{Rows: rows, Options: opt, FirstLayer: first}
	st, err := w.s.Stepper.Begin(ctx, b)
	if err != nil {
		t.Fatalf("begin %+v: %v", rows, err)
	}
	rst, err := w.ref.Begin(ctx, decode.Batch{Rows: rrows, Options: opt, FirstLayer: first})
	if err != nil {
		t.Fatal(err)
	}
	var res, rres decode.Result
	nNew := b.NewRows()
	tol := w.s.Tol
	if tol == 0 {
		tol = 1e-4
	}
	dev := w.s.Tensors
	if opt.Phased {
		dev = nil // a phased step runs on host tensors
	}
	// Device outputs are read back after End: per layer, the output
	// tensor and the reference's output.
	var devO []decode.Tensor
	var refO [][]float32
	for l := first; l < c.Layers; l++ {
		q, k, v := w.randn(len(rows)*c.QRow()), w.randn(nNew*c.KVRow()), w.randn(nNew*c.KVRow())
		if dev != nil {
			res.O = w.alloc(len(q))
			devO = append(devO, res.O)
			if err := st.Layer(ctx, l, w.upload(q), w.upload(k), w.upload(v), &res); err != nil {
				t.Fatalf("layer %d (device tensors): %v", l, err)
			}
		} else if err := st.Layer(ctx, l, decode.Host(q), decode.Host(k), decode.Host(v), &res); err != nil {
			t.Fatalf("layer %d: %v", l, err)
		}
		if err := rst.Layer(ctx, l, decode.Host(q), decode.Host(k), decode.Host(v), &rres); err != nil {
			t.Fatal(err)
		}
		for i := range rows {
			if res.Plans[i] != rres.Plans[i] {
				t.Errorf("layer %d row %d: plan %+v, reference %+v", l, i, res.Plans[i], rres.Plans[i])
			}
		}
		if dev != nil {
			refO = append(refO, append([]float32(nil), rres.O.Data...))
			continue
		}
		o, err := res.O.HostData("output")
		if err != nil {
			t.Fatal(err)
		}
		if i, g, r := far(o, rres.O.Data, tol); i >= 0 {
			t.Errorf("layer %d: output %d (row %d) is %v, reference %v", l, i, i/c.QRow(), g, r)
		}
		if i, g, r := far(res.LSE, rres.LSE, tol); i >= 0 {
			t.Errorf("layer %d: lse %d (row %d) is %v, reference %v", l, i, i/c.QHeads, g, r)
		}
	}
	if err := st.End(ctx); err != nil {
		t.Fatalf("end: %v", err)
	}
	if err := rst.End(ctx); err != nil {
		t.Fatal(err)
	}
	for j, ot := range devO {
		o, err := dev.DownloadTensor(ctx, ot)
		if err != nil {
			t.Fatalf("read back the output of layer %d: %v", first+j, err)
		}
		if i, g, r := far(o, refO[j], tol); i >= 0 {
			t.Errorf("layer %d (device tensors): output %d (row %d) is %v, reference %v", first+j, i, i/c.QRow(), g, r)
		}
	}
	for i, r := range rows {
		want, _ := w.ref.Len(ctx, rrows[i].Seq)
		if got, err := w.s.Len(ctx, r.Seq); err != nil || got != want {
			t.Errorf("after the step: sequence %d holds %d tokens (%v), reference %d", r.Seq, got, err, want)
		}
	}
}

// far returns the first index where got and want differ by more than
// tol x (1 + |want|), with the two values (-1: none).
func far(got, want []float32, tol float64) (int, float32, float32) {
	if len(got) != len(want) {
		return 0, float32(len(got)), float32(len(want))
	}
	for i := range got {
		g, r := float64(got[i]), float64(want[i])
		if !(math.Abs(g-r) <= tol*(1+math.Abs(r))) {
			return i, got[i], want[i]
		}
	}
	return -1, 0, 0
}

// matchesReference: batches of sequences at the lengths where tail
// pages are 1, S-1, S and S+1 long, growing across steps, with
// per-row budgets and dense layers, query-only rows, a forced-dense
// step, a phased one and one that starts past the first layer equal the
// reference: same plans, outputs and LSE within Tol, same lengths.
func matchesReference(t *testing.T, s Subject) {
	S := s.Config.PageSize
	w := newWorld(t, s, 1, S-1, S, S+1, 6*S+2, 0)
	all := func(budgets ...int) []decode.Row {
		rows := make([]decode.Row, len(w.ids))
		for i := range rows {
			rows[i] = decode.Row{Seq: decode.SeqID(i), New: true, Budget: budgets[i%len(budgets)]}
		}
		return rows
	}
	for step := range 6 {
		w.step(all(0, 2*S, 0, 4*S), decode.Options{})
		if t.Failed() {
			t.Fatalf("step %d", step)
		}
	}
	w.step([]decode.Row{{Seq: 4, New: true, DenseLayers: 2}, {Seq: 1, New: false}, {Seq: 2, New: true, Budget: S}}, decode.Options{})
	w.step([]decode.Row{{Seq: 5, New: false}, {Seq: 3, New: true}}, decode.Options{ForceDense: true})
	w.step([]decode.Row{{Seq: 4}}, decode.Options{Phased: true})
	// From layer 1 on (layer 0 of the query-only row stays as it is).
	w.stepFrom(1, []decode.Row{{Seq: 0}, {Seq: 2}}, decode.Options{})
}

// mustBad checks that err is one of the refusals in want.
func (w *world) mustBad(what string, err error, want ...error) {
	w.t.Helper()
	if err == nil {
		w.t.Errorf("%s: no error", what)
		return
	}
	for _, target := range want {
		if errors.Is(err, target) {
			return
		}
	}
	w.t.Errorf("%s: %v, want one of %v", what, err, want)
}

func (w *world) lens() []int {
	var n []int
	for _, id := range w.ids {
		l, err := w.s.Len(context.Background(), id)
		if err != nil {
			w.t.Fatal(err)
		}
		n = append(n, l)
	}
	return n
}

func (w *world) unchanged(before []int) {
	w.t.Helper()
	if after := w.lens(); fmt.Sprint(after) != fmt.Sprint(before) {
		w.t.Fatalf("lengths %v after bad input, %v before", after, before)
	}
	rows := make([]decode.Row, len(w.ids))
	for i := range rows {
		rows[i] = decode.Row{Seq: decode.SeqID(i), New: true}
	}
	w.step(rows, decode.Options{})
}

// badBegin: Begin refuses bad batches with ErrBadInput (or an error of
// the runner's for an unknown sequence) and changes nothing.
func badBegin(t *testing.T, s Subject) {
	ctx := context.Background()
	c := s.Config
	w := newWorld(t, s, 5, 9, 0)
	before := w.lens()
	id := func(i int) decode.SeqID { return w.ids[i] }
	cases := []struct {
		name string
		b    decode.Batch
	}{
		{"empty batch", decode.Batch{}},
		{"sequence twice", decode.Batch{Rows: []decode.Row{{Seq: id(0), New: true}, {Seq: id(0), New: true}}}},
		{"budget below one page", decode.Batch{Rows: []decode.Row{{Seq: id(0), New: true, Budget: c.PageSize - 1}}}},
		{"negative budget", decode.Batch{Rows: []decode.Row{{Seq: id(0), New: true, Budget: -c.PageSize}}}},
		{"dense layers beyond the model", decode.Batch{Rows: []decode.Row{{Seq: id(0), New: true, DenseLayers: c.Layers + 1}}}},
		{"first layer outside", decode.Batch{Rows: []decode.Row{{Seq: id(0), New: true}}, FirstLayer: c.Layers}},
		{"query of an empty sequence", decode.Batch{Rows: []decode.Row{{Seq: id(2)}}}},
	}
	for _, tc := range cases {
		st, err := s.Stepper.Begin(ctx, tc.b)
		w.mustBad(tc.name, w.opened(ctx, tc.b, st, err), decode.ErrBadInput)
	}
	unknown := decode.SeqID(1<<40 + 7)
	b := decode.Batch{Rows: []decode.Row{{Seq: id(1), New: true}, {Seq: unknown, New: true}}}
	st, err := s.Stepper.Begin(ctx, b)
	if w.opened(ctx, b, st, err) == nil {
		t.Errorf("unknown sequence: no error")
	}
	w.unchanged(before)
}

// opened returns the error of a Begin of b that returned st and err:
// when Begin returned a step, its first Layer call (with inputs of the
// batch's shapes) tells whether it opened after all (a runner that sends
// its begin ahead of the first layer reports a refusal there, wrapping
// decode.ErrBeginRefused, and later Layer calls wrap
// decode.ErrStepFailed). The step is ended.
func (w *world) opened(ctx context.Context, b decode.Batch, st decode.Step, err error) error {
	w.t.Helper()
	if err != nil {
		return err
	}
	defer st.End(ctx)
	c := w.s.Config
	q, k := w.randn(len(b.Rows)*c.QRow()), w.randn(b.NewRows()*c.KVRow())
	var res decode.Result
	if err = st.Layer(ctx, b.FirstLayer, decode.Host(q), decode.Host(k), decode.Host(k), &res); err == nil {
		return nil
	}
	if !errors.Is(err, decode.ErrBeginRefused) || errors.Is(err, decode.ErrStepFailed) {
		w.t.Errorf("a refusal learnt at the first layer: %v, want decode.ErrBeginRefused without decode.ErrStepFailed", err)
	}
	if err2 := st.Layer(ctx, b.FirstLayer, decode.Host(q), decode.Host(k), decode.Host(k), &res); !errors.Is(err2, decode.ErrStepFailed) {
		w.t.Errorf("a Layer after a refusal learnt at the first layer: %v, want decode.ErrStepFailed", err2)
	}
	return err
}

// badLayer: Layer refuses bad input with ErrBadInput and changes
// nothing (the step stays open and usable); a Layer after End and a
// second End return ErrStepEnded.
func badLayer(t *testing.T, s Subject) {
	ctx := context.Background()
	c := s.Config
	w := newWorld(t, s, 5, 9)
	st, err := s.Stepper.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: w.ids[0], New: true}, {Seq: w.ids[1], New: true}}})
	if err != nil {
		t.Fatal(err)
	}
	q, k := w.randn(2*c.QRow()), w.randn(2*c.KVRow())
	nan := append([]float32(nil), q...)
	nan[3] = float32(math.NaN())
	inf := append([]float32(nil), k...)
	inf[1] = float32(math.Inf(1))
	huge := append([]float32(nil), q...)
	huge[5] = 2 * decode.MagnitudeLimit(c.HeadDim)
	var res decode.Result
	for _, tc := range []struct {
		name    string
		layer   int
		q, k, v []float32
	}{
		{"short q", 0, q[1:], k, k},
		{"k for one row of two", 0, q, k[:c.KVRow()], k[:c.KVRow()]},
		{"v shorter than k", 0, q, k, k[1:]},
		{"NaN in q", 0, nan, k, k},
		{"Inf in k", 0, q, inf, k},
		{"q beyond decode.MagnitudeLimit", 0, huge, k, k},
		{"layer outside the model", c.Layers, q, k, k},
		{"negative layer", -1, q, k, k},
	} {
		w.mustBad(tc.name, st.Layer(ctx, tc.layer, decode.Host(tc.q), decode.Host(tc.k), decode.Host(tc.v), &res), decode.ErrBadInput)
	}
	devOut := decode.Result{O: decode.Tensor{Device: decode.Device{Kind: decode.CUDA}, Ptr: 1 << 20, Len: 2 * c.QRow()}}
	w.mustBad("a device output", st.Layer(ctx, 0, decode.Host(q), decode.Host(k), decode.Host(k), &devOut), decode.ErrBadInput, decode.ErrDeviceTensor)
	dev := decode.Tensor{Device: decode.Device{Kind: decode.CUDA}, Ptr: 1 << 20, Len: len(q)}
	w.mustBad("a device tensor", st.Layer(ctx, 0, dev, decode.Host(k), decode.Host(k), &res), decode.ErrBadInput, decode.ErrDeviceTensor)
	// The step is still usable.
	if err := st.Layer(ctx, 0, decode.Host(q), decode.Host(k), decode.Host(k), &res); err != nil {
		t.Fatalf("a good layer after bad ones: %v", err)
	}
	w.mustBad("the same layer again", st.Layer(ctx, 0, decode.Host(q), decode.Host(k), decode.Host(k), &res), decode.ErrBadInput)
	if err := st.End(ctx); err != nil {
		t.Fatal(err)
	}
	w.mustBad("layer after End", st.Layer(ctx, 1, decode.Host(q), decode.Host(k), decode.Host(k), &res), decode.ErrStepEnded)
	w.mustBad("second End", st.End(ctx), decode.ErrStepEnded)
	// Layer 0 took the new tokens, the other layers did not: the lengths
	// differ by layer now, and a step over a sequence refuses the layer
	// whose length is not the first layer's.
	st, err = s.Stepper.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: w.ids[0], New: true}}})
	if err != nil {
		t.Fatal(err)
	}
	q1, k1 := q[:c.QRow()], k[:c.KVRow()]
	if err := st.Layer(ctx, 0, decode.Host(q1), decode.Host(k1), decode.Host(k1), &res); err != nil {
		t.Fatal(err)
	}
	w.mustBad("a layer whose length differs from the first layer's", st.Layer(ctx, 1, decode.Host(q1), decode.Host(k1), decode.Host(k1), &res), decode.ErrBadInput)
	if err := st.End(ctx); err != nil {
		t.Fatal(err)
	}
}

// stepOpen: a second Begin of a sequence of the open step waits and then
// fails with ErrStepOpen; after End a Begin succeeds at once. The open
// step runs its first layer first: a runner that sends its begin ahead
// has surely opened the step once the layer's answer came.
func stepOpen(t *testing.T, s Subject) {
	ctx := context.Background()
	w := newWorld(t, s, 5, 9)
	st, err := s.Stepper.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: w.ids[0], New: true}, {Seq: w.ids[1], New: true}}})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Config
	var res decode.Result
	if err := st.Layer(ctx, 0, decode.Host(w.randn(2*c.QRow())), decode.Host(w.randn(2*c.KVRow())), decode.Host(w.randn(2*c.KVRow())), &res); err != nil {
		t.Fatalf("the open step's first layer: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	b := decode.Batch{Rows: []decode.Row{{Seq: w.ids[1], New: true}}}
	st2, err := s.Stepper.Begin(short, b)
	err = w.opened(short, b, st2, err)
	cancel()
	w.mustBad("Begin while a step is open", err, decode.ErrStepOpen)
	if err := st.End(ctx); err != nil {
		t.Fatal(err)
	}
	st, err = s.Stepper.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: w.ids[1], New: true}}})
	if err != nil {
		t.Fatalf("Begin after End: %v", err)
	}
	if err := st.End(ctx); err != nil {
		t.Fatal(err)
	}
}
