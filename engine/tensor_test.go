package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/decode/decodetest"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/plan"
)

// deviceEngine is an engine of one rank whose pages live on a
// QueuedDevice (the CPU twin of a device that queues its work).
func deviceEngine(t *testing.T, cp int, gqa plan.GQAMode) (*Engine, *backendtest.QueuedDevice, decodetest.Config) {
	t.Helper()
	dc := decodetest.SuggestedConfig()
	dc.Policy.GQA = gqa
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	t.Cleanup(func() { cpu.Close() })
	qd := &backendtest.QueuedDevice{FakeDevice: backendtest.FakeDevice{CPU: cpu}}
	cfg := DefaultConfig()
	cfg.Layers, cfg.Geometry, cfg.Policy = dc.Layers, dc.Geometry, dc.Policy
	cfg.CP, cfg.CapacityPages = cp, 64
	cfg.Backend, cfg.DeviceResident = qd, true
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, qd, dc
}

// TestStepperDeviceTensors runs the decode.Stepper suite with q, k, v and
// the outputs in the pretend device memory of a QueuedDevice: the engine
// takes them in place and equals the host reference.
func TestStepperDeviceTensors(t *testing.T) {
	for _, gqa := range []plan.GQAMode{plan.GroupMax, plan.PerHead} {
		t.Run(fmt.Sprint(gqa), func(t *testing.T) {
			decodetest.Run(t, func(t *testing.T) decodetest.Subject {
				e, qd, dc := deviceEngine(t, 1, gqa)
				return decodetest.Subject{Stepper: e, Config: dc, Tensors: qd,
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

// TestDeviceTensorsOneSyncPerStep: a step of L layers on device tensors
// queues L steps on the device and waits for them once, at End; before
// End the outputs are not written (the twin writes them at its Sync).
func TestDeviceTensorsOneSyncPerStep(t *testing.T) {
	e, qd, dc := deviceEngine(t, 1, plan.GroupMax)
	ctx := context.Background()
	id, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	kv := make([]float32, 9*dc.KVRow())
	for i := range kv {
		kv[i] = float32(i%7) / 7
	}
	for l := range dc.Layers {
		if err := e.Append(id, l, kv, kv); err != nil {
			t.Fatal(err)
		}
	}
	syncs, queued := qd.Syncs(), qd.Queued()
	st, err := e.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: id, New: true}}})
	if err != nil {
		t.Fatal(err)
	}
	var outs []decode.Tensor
	for l := range dc.Layers {
		q, k, v := alloc(t, qd, dc.QRow()), alloc(t, qd, dc.KVRow()), alloc(t, qd, dc.KVRow())
		for _, x := range []decode.Tensor{q, k, v} {
			ones := make([]float32, x.Len)
			for i := range ones {
				ones[i] = 1
			}
			if err := qd.UploadTensor(x, ones); err != nil {
				t.Fatal(err)
			}
		}
		res := decode.Result{O: alloc(t, qd, dc.QRow())}
		if err := st.Layer(ctx, l, q, k, v, &res); err != nil {
			t.Fatalf("layer %d: %v", l, err)
		}
		outs = append(outs, res.O)
	}
	if got := qd.Queued() - queued; got != dc.Layers {
		t.Errorf("%d steps queued for %d layers", got, dc.Layers)
	}
	if got := qd.Syncs() - syncs; got != 0 {
		t.Errorf("%d host synchronisations before End, want 0", got)
	}
	if err := st.End(ctx); err != nil {
		t.Fatal(err)
	}
	if got := qd.Syncs() - syncs; got != 1 {
		t.Errorf("%d host synchronisations for the step, want 1", got)
	}
	for l, o := range outs {
		got, err := qd.DownloadTensor(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		// Every value of every page is 0..6/7 and the new token's v is 1:
		// each output is a convex combination, inside [0, 1], and not the
		// zeros the tensor was allocated with.
		for i, x := range got {
			if !(x > 0 && x <= 1) {
				t.Fatalf("layer %d: output %d is %v, want in (0, 1]", l, i, x)
			}
		}
	}
	if n, _ := e.Len(id); n != 10 {
		t.Errorf("sequence holds %d tokens after the step, want 10", n)
	}
}

// TestDeviceTensorsRefused: device tensors on another device, of the
// wrong length, or given to an engine that cannot take them in place
// (CP 2) are refused with nothing changed; the step stays usable.
func TestDeviceTensorsRefused(t *testing.T) {
	ctx := context.Background()
	for _, cp := range []int{1, 2} {
		t.Run(fmt.Sprintf("cp%d", cp), func(t *testing.T) {
			e, qd, dc := deviceEngine(t, cp, plan.GroupMax)
			cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
			t.Cleanup(func() { cpu.Close() })
			other := &backendtest.QueuedDevice{FakeDevice: backendtest.FakeDevice{CPU: cpu}, Ordinal: 1}
			id, err := e.Create(plan.Striped)
			if err != nil {
				t.Fatal(err)
			}
			kv := make([]float32, 5*dc.KVRow())
			for l := range dc.Layers {
				if err := e.Append(id, l, kv, kv); err != nil {
					t.Fatal(err)
				}
			}
			st, err := e.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: id, New: true}}})
			if err != nil {
				t.Fatal(err)
			}
			q, k, v := alloc(t, qd, dc.QRow()), alloc(t, qd, dc.KVRow()), alloc(t, qd, dc.KVRow())
			cases := []struct {
				name    string
				q, k, v decode.Tensor
				o       decode.Tensor
				want    error
			}{
				{"q on another device", alloc(t, other, dc.QRow()), k, v, alloc(t, qd, dc.QRow()), decode.ErrDeviceTensor},
				{"host output", q, k, v, decode.Host(make([]float32, dc.QRow())), decode.ErrDeviceTensor},
				{"host k", q, decode.Host(make([]float32, dc.KVRow())), v, alloc(t, qd, dc.QRow()), decode.ErrDeviceTensor},
				{"short q", q.Slice(0, dc.QRow()-1), k, v, alloc(t, qd, dc.QRow()), decode.ErrBadInput},
				{"k on another stream", q, onStream(k, 7), v, alloc(t, qd, dc.QRow()), decode.ErrDeviceTensor},
				{"output over q", q, k, v, q, decode.ErrBadInput},
				{"no new token", q, decode.Tensor{}, decode.Tensor{}, alloc(t, qd, dc.QRow()), decode.ErrBadInput},
			}
			if cp > 1 {
				cases = []struct {
					name    string
					q, k, v decode.Tensor
					o       decode.Tensor
					want    error
				}{{"two ranks", q, k, v, alloc(t, qd, dc.QRow()), decode.ErrDeviceTensor}}
			}
			queued := qd.Queued()
			for _, tc := range cases {
				res := decode.Result{O: tc.o}
				err := st.Layer(ctx, 0, tc.q, tc.k, tc.v, &res)
				if !errors.Is(err, tc.want) {
					t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
				}
			}
			if qd.Queued() != queued {
				t.Errorf("a refused layer queued work")
			}
			// The step is still open and usable, on host tensors (and the
			// refused layers appended nothing: one token more at End).
			var res decode.Result
			for l := range dc.Layers {
				if err := st.Layer(ctx, l, decode.Host(make([]float32, dc.QRow())), decode.Host(make([]float32, dc.KVRow())), decode.Host(make([]float32, dc.KVRow())), &res); err != nil {
					t.Fatalf("layer %d after the refusals: %v", l, err)
				}
			}
			if err := st.End(ctx); err != nil {
				t.Fatal(err)
			}
			if n, _ := e.Len(id); n != 6 {
				t.Errorf("sequence holds %d tokens after the step, want 6", n)
			}
		})
	}
}

// alloc returns a tensor of n floats on d.
func alloc(t *testing.T, d *backendtest.QueuedDevice, n int) decode.Tensor {
	t.Helper()
	x, err := d.AllocTensor(n)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// onStream returns t ordered on stream s.
func onStream(t decode.Tensor, s uintptr) decode.Tensor {
	t.Stream = s
	return t
}
