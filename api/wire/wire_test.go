package wire

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/plan"
)

// TestTensorRoundTrip carries float32 and int32 tensors both ways: nil
// stays absent, empty stays empty, values (Inf, NaN bits, negatives) come
// back bit for bit, and the shape is rows of the inner dims.
func TestTensorRoundTrip(t *testing.T) {
	x := []float32{1, -2, float32(math.Inf(1)), 4, 5, float32(math.NaN())}
	ft := Float32Tensor(x, 2, 3)
	if !reflect.DeepEqual(ft.Shape, []uint32{2, 3}) {
		t.Errorf("shape %v, want [2 3]", ft.Shape)
	}
	back, err := Float32s(ft, "x", 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range x {
		if math.Float32bits(back[i]) != math.Float32bits(x[i]) {
			t.Errorf("x[%d] = %v, want %v", i, back[i], x[i])
		}
	}
	if back, err := Float32s(ft, "x", AnyDim, 3); err != nil || len(back) != 6 {
		t.Errorf("any leading dim: %v, %v", back, err)
	}
	if got := Float32Tensor([]float32{1, 2, 3}, 1, 2); !reflect.DeepEqual(got.Shape, []uint32{3}) {
		t.Errorf("inner dims that do not divide: shape %v, want [3]", got.Shape)
	}
	if Float32Tensor(nil, 0, 3) != nil || Int32Tensor(nil, 0) != nil {
		t.Error("nil does not encode as an absent tensor")
	}
	empty := Float32Tensor([]float32{}, 0, 3)
	if d, err := DecodeFloat32(nil, empty, AnyDim, 3); err != nil || d == nil || len(d) != 0 {
		t.Errorf("empty: %#v, %v", d, err)
	}
	if d, err := DecodeFloat32(nil, nil); err != nil || d != nil {
		t.Errorf("absent: %#v, %v", d, err)
	}
	if d, err := DecodeFloat32(nil, &workerv1.Tensor{}); err != nil || d != nil {
		t.Errorf("empty message (absent entry): %#v, %v", d, err)
	}
	buf := make([]float32, 0, 8)
	if d, _ := DecodeFloat32(buf, ft); &d[0] != &buf[:1][0] {
		t.Error("DecodeFloat32 did not reuse dst's storage")
	}

	ix := []int32{0, -1, math.MaxInt32, math.MinInt32}
	if back, err := Int32s(Int32Tensor(ix, len(ix)), "i", len(ix)); err != nil || !reflect.DeepEqual(back, ix) {
		t.Errorf("int32 round trip: %v, %v", back, err)
	}
	if back, err := Int32s(nil, "i", 0); err != nil || back == nil || len(back) != 0 {
		t.Errorf("absent int32 of length 0: %#v, %v", back, err)
	}
}

// TestTensorErrors checks that Float32s and Int32s refuse what does not
// fit, naming the field and the reason and wrapping ErrBadTensor, and
// that the encoders name a count the wire cannot carry.
func TestTensorErrors(t *testing.T) {
	f := func(shape ...uint32) *workerv1.Tensor {
		return &workerv1.Tensor{Dtype: workerv1.DType_DTYPE_FLOAT32, Shape: shape, Data: make([]byte, 16)}
	}
	cases := []struct {
		name string
		err  func() error
		want string
	}{
		{"missing", func() error { _, err := Float32s(nil, "k", 1, 4); return err }, "k: missing"},
		{"shape", func() error { _, err := Float32s(f(2, 2), "k", 2, 4); return err }, "k: shape [2 2], want [2 4]"},
		{"any dim", func() error { _, err := Float32s(f(2, 2), "k", AnyDim, 4); return err }, "k: shape [2 2], want [* 4]"},
		{"product", func() error { _, err := Float32s(f(2, 3), "q", AnyDim, 3); return err }, "q: shape [2 3] does not hold the 4 elements"},
		{"overflowing shape", func() error { _, err := Float32s(f(1<<31, 1<<31, 1<<31, 1<<31), "q"); return err }, "does not hold"},
		{"partial element", func() error {
			_, err := Float32s(&workerv1.Tensor{Dtype: workerv1.DType_DTYPE_FLOAT32, Shape: []uint32{2}, Data: make([]byte, 7)}, "v")
			return err
		}, "v: 7 bytes of data are not whole 4-byte elements"},
		{"dtype", func() error { _, err := Int32s(f(4), "pages", -1); return err }, "pages: dtype DTYPE_FLOAT32, want DTYPE_INT32"},
		{"int32 length", func() error { _, err := Int32s(Int32Tensor([]int32{1, 2}, 2), "indptr", 3); return err }, "indptr: 2 elements, want 3"},
		{"int32 missing", func() error { _, err := Int32s(nil, "indptr", 3); return err }, "indptr: missing"},
	}
	for _, tc := range cases {
		err := tc.err()
		if !errors.Is(err, ErrBadTensor) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrBadTensor with %q", tc.name, err, tc.want)
		}
	}
	if _, err := EncodeFloat32([]float32{1, 2}, -1, -2); err == nil || !strings.Contains(err.Error(), "dim -1 is not a uint32") {
		t.Errorf("negative inner dims: %v", err)
	}
}

// TestPolicyRoundTrip carries a policy both ways and names what does not
// decode.
func TestPolicyRoundTrip(t *testing.T) {
	p := plan.Policy{PageSize: 16, BudgetTokens: 512, SinkPages: 1, LocalPages: 2, DenseLayers: 3, DenseRho: 0.3125, HierGroup: 8, TopP: 0.9375, SubBoxes: 4, ReuseSteps: 4, ReuseLayers: []int{4, 6},
		LayerBudget: map[int]int{0: 64, 5: 1024}, GQA: plan.PerHead, Selector: plan.Dense}
	m, err := PolicyProto(p)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Policy(m)
	if err != nil || !reflect.DeepEqual(back, p) {
		t.Fatalf("round trip: %+v, %v\nwant %+v", back, err, p)
	}
	d := plan.DefaultPolicy()
	m, _ = PolicyProto(d)
	if back, err := Policy(m); err != nil || !reflect.DeepEqual(back, d) {
		t.Errorf("default policy: %+v, %v\nwant %+v", back, err, d)
	}
	neg := p
	neg.BudgetTokens = -1
	if _, err := PolicyProto(neg); err == nil || !strings.Contains(err.Error(), "budget tokens -1") {
		t.Errorf("negative budget: %v", err)
	}
	m, _ = PolicyProto(p)
	m.Selector = "psychic"
	if _, err := Policy(m); err == nil || !strings.Contains(err.Error(), "policy: ") || !strings.Contains(err.Error(), "psychic") {
		t.Errorf("unknown selector: %v", err)
	}
	if _, err := Policy(nil); err == nil {
		t.Error("a missing policy decodes")
	}
}

// FuzzDecodeFloat32 feeds the decoder arbitrary tensors: it never
// panics, and what it accepts has the element count of its data and the
// wanted inner dim.
func FuzzDecodeFloat32(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64}, uint32(2), uint32(1), int32(1), 1)
	f.Add([]byte{}, uint32(0), uint32(4), int32(4), 1)
	f.Add([]byte{1, 2, 3}, uint32(1), uint32(1), int32(-1), 2)
	f.Fuzz(func(t *testing.T, data []byte, s0, s1 uint32, inner int32, dtype int) {
		tn := &workerv1.Tensor{Dtype: workerv1.DType(dtype), Shape: []uint32{s0, s1}, Data: data}
		x, err := Float32s(tn, "x", AnyDim, int(inner))
		if err != nil {
			if !errors.Is(err, ErrBadTensor) {
				t.Fatalf("error %v does not wrap ErrBadTensor", err)
			}
			return
		}
		if len(x) != len(data)/4 || (inner >= 0 && s1 != uint32(inner)) {
			t.Fatalf("accepted %d elements of shape %v from %d bytes, inner %d", len(x), tn.Shape, len(data), inner)
		}
	})
}
