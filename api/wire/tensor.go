package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
)

// ErrBadTensor: a tensor that [Float32s] or [Int32s] refuses (missing,
// another dtype or shape, data that does not match its shape).
var ErrBadTensor = errors.New("wire: bad tensor")

// AnyDim is a dim of a wanted shape that the decoders do not check (any
// negative dim is).
const AnyDim = -1

// Absent reports whether t stands for a nil slice: nil, or an empty
// message (no dtype, shape or data: an absent entry of a repeated
// field).
func Absent(t *workerv1.Tensor) bool {
	return t == nil || (t.Dtype == workerv1.DType_DTYPE_UNSPECIFIED && len(t.Shape) == 0 && len(t.Data) == 0)
}

// EncodeFloat32 encodes x as a float32 tensor of rows of the inner dims:
// shape [len(x)/prod(inner)] + inner, or [len(x)] when the inner dims do
// not divide len(x) (which a decoder that wants them refuses). nil x is
// absent (nil). A count the wire cannot carry (not a uint32) is an error
// naming it ("rows", "dim" or "length"); the tensor then holds 0 in its
// place.
func EncodeFloat32(x []float32, inner ...int) (*workerv1.Tensor, error) {
	if x == nil {
		return nil, nil
	}
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	shape, err := shapeOf(len(x), inner)
	return &workerv1.Tensor{Dtype: workerv1.DType_DTYPE_FLOAT32, Shape: shape, Data: b}, err
}

// EncodeInt32 encodes x as an int32 vector; nil x is absent (nil).
func EncodeInt32(x []int32) (*workerv1.Tensor, error) {
	if x == nil {
		return nil, nil
	}
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	var err error
	n := u32("length", len(x), &err)
	return &workerv1.Tensor{Dtype: workerv1.DType_DTYPE_INT32, Shape: []uint32{n}, Data: b}, err
}

// u32 converts a count to the wire, keeping the first error in *err.
func u32(what string, v int, err *error) uint32 {
	if v < 0 || uint64(v) > math.MaxUint32 {
		if *err == nil {
			*err = fmt.Errorf("%s %d is not a uint32", what, v)
		}
		return 0
	}
	return uint32(v)
}

// shapeOf is the shape of n elements of rows of inner dims: [n/prod,
// inner...] when inner divides n, else [n].
func shapeOf(n int, inner []int) ([]uint32, error) {
	var err error
	p := 1
	for _, d := range inner {
		p *= d
	}
	if p <= 0 || n%p != 0 {
		return []uint32{u32("length", n, &err)}, err
	}
	s := []uint32{u32("rows", n/p, &err)}
	for _, d := range inner {
		s = append(s, u32("dim", d, &err))
	}
	return s, err
}

// DecodeFloat32 decodes a float32 tensor into dst's storage (reusing its
// capacity) and checks its shape against want (nil: any shape; a negative
// dim: any size). An absent tensor gives dst[:0] (nil for a nil dst), a
// present one a non-nil slice. An error (dst[:0] with it) gives the
// reason only; the caller names the field.
func DecodeFloat32(dst []float32, t *workerv1.Tensor, want ...int) ([]float32, error) {
	if Absent(t) {
		return dst[:0], nil
	}
	n, err := elems(t, workerv1.DType_DTYPE_FLOAT32, want)
	if err != nil {
		return dst[:0], err
	}
	out := slices.Grow(dst[:0], n)[:n]
	if out == nil {
		out = []float32{}
	}
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return out, nil
}

// DecodeInt32 decodes an int32 vector (any length) like DecodeFloat32.
func DecodeInt32(dst []int32, t *workerv1.Tensor) ([]int32, error) {
	if Absent(t) {
		return dst[:0], nil
	}
	n, err := elems(t, workerv1.DType_DTYPE_INT32, []int{AnyDim})
	if err != nil {
		return dst[:0], err
	}
	out := slices.Grow(dst[:0], n)[:n]
	if out == nil {
		out = []int32{}
	}
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return out, nil
}

// elems validates t (dtype, whole elements, wanted dims, shape product;
// want nil: any shape) and returns its element count.
func elems(t *workerv1.Tensor, dtype workerv1.DType, want []int) (int, error) {
	if t.Dtype != dtype {
		return 0, fmt.Errorf("dtype %v, want %v", t.Dtype, dtype)
	}
	if len(t.Data)%4 != 0 {
		return 0, fmt.Errorf("%d bytes of data are not whole 4-byte elements", len(t.Data))
	}
	n := len(t.Data) / 4
	if want != nil {
		ok := len(t.Shape) == len(want)
		for i := 0; ok && i < len(want); i++ {
			ok = want[i] < 0 || uint64(want[i]) == uint64(t.Shape[i])
		}
		if !ok {
			return 0, fmt.Errorf("shape %v, want %s", t.Shape, dims(want))
		}
	}
	// The product, bounded by n so that it cannot overflow.
	p := 1
	if !slices.Contains(t.Shape, 0) {
		for _, s := range t.Shape {
			if uint64(s) > uint64(n/p) {
				p = -1
				break
			}
			p *= int(s)
		}
	} else {
		p = 0
	}
	if p != n {
		return 0, fmt.Errorf("shape %v does not hold the %d elements of its data", t.Shape, n)
	}
	return n, nil
}

// dims formats a wanted shape ("[* 4 16]").
func dims(want []int) string {
	parts := make([]string, len(want))
	for i, w := range want {
		parts[i] = "*"
		if w >= 0 {
			parts[i] = strconv.Itoa(w)
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// Float32Tensor encodes x as a float32 tensor of rows of the inner dims
// ([len(x)/prod(inner)] + inner; [len(x)] when they do not divide it,
// which Float32s then refuses). nil x is an absent tensor. rows, the
// leading dim, is for the reader: it follows from len(x).
func Float32Tensor(x []float32, rows int, inner ...int) *workerv1.Tensor {
	_ = rows
	t, _ := EncodeFloat32(x, inner...)
	return t
}

// Int32Tensor encodes x as an int32 vector (n, its length, is for the
// reader).
func Int32Tensor(x []int32, n int) *workerv1.Tensor {
	_ = n
	t, _ := EncodeInt32(x)
	return t
}

// Float32s decodes a float32 tensor of the wanted shape (a negative dim:
// any), naming field in its error (wrapping ErrBadTensor). An absent
// tensor is an error: the field is required.
func Float32s(t *workerv1.Tensor, field string, want ...int) ([]float32, error) {
	if Absent(t) {
		return nil, fmt.Errorf("%w: %s: missing", ErrBadTensor, field)
	}
	x, err := DecodeFloat32(nil, t, want...)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadTensor, field, err)
	}
	return x, nil
}

// Int32s decodes an int32 vector of n elements (n < 0: any) like
// Float32s; an absent tensor is an empty vector when n is 0.
func Int32s(t *workerv1.Tensor, field string, n int) ([]int32, error) {
	if Absent(t) {
		if n == 0 {
			return []int32{}, nil
		}
		return nil, fmt.Errorf("%w: %s: missing", ErrBadTensor, field)
	}
	x, err := DecodeInt32(nil, t)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadTensor, field, err)
	}
	if n >= 0 && len(x) != n {
		return nil, fmt.Errorf("%w: %s: %d elements, want %d", ErrBadTensor, field, len(x), n)
	}
	return x, nil
}
