package remote

import (
	"fmt"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/worker"
)

// The tensor and config codecs of the worker API, for the other APIs
// that share its Tensor and GridConfig messages (api/decode/v1).

// Float32Tensor encodes x as a float32 tensor of rows of the inner dims
// ([len(x)/prod(inner)] + inner; [len(x)] when they do not divide it,
// which Float32s then refuses). nil x is an absent tensor.
func Float32Tensor(x []float32, rows int, inner ...int) *workerv1.Tensor {
	_ = rows // the leading dim follows from len(x)
	e := &enc{what: "tensor"}
	return e.f32("tensor", x, inner...)
}

// Int32Tensor encodes x as an int32 vector (n is len(x)).
func Int32Tensor(x []int32, n int) *workerv1.Tensor {
	_ = n
	e := &enc{what: "tensor"}
	return e.i32("tensor", x)
}

// Float32s decodes a float32 tensor of the wanted shape (a negative dim:
// any), naming field in its error (wrapping worker.ErrBadMessage). An
// absent tensor is an error: the field is required.
func Float32s(t *workerv1.Tensor, field string, want ...int) ([]float32, error) {
	if absent(t) {
		return nil, fmt.Errorf("%w: %s: missing", worker.ErrBadMessage, field)
	}
	for i := range want {
		if want[i] < 0 {
			want[i] = anyDim
		}
	}
	d := &dec{what: field, sentinel: worker.ErrBadMessage}
	x := d.f32(nil, t, field, want...)
	if d.err != nil {
		return nil, fmt.Errorf("%w: %s: %s", worker.ErrBadMessage, field, trimWhat(d.err, field))
	}
	return x, nil
}

// Int32s decodes an int32 vector of n elements (n < 0: any) like
// Float32s.
func Int32s(t *workerv1.Tensor, field string, n int) ([]int32, error) {
	if absent(t) {
		if n == 0 {
			return []int32{}, nil
		}
		return nil, fmt.Errorf("%w: %s: missing", worker.ErrBadMessage, field)
	}
	d := &dec{what: field, sentinel: worker.ErrBadMessage}
	x := d.i32(nil, t, field)
	if d.err != nil {
		return nil, fmt.Errorf("%w: %s: %s", worker.ErrBadMessage, field, trimWhat(d.err, field))
	}
	if n >= 0 && len(x) != n {
		return nil, fmt.Errorf("%w: %s: %d elements, want %d", worker.ErrBadMessage, field, len(x), n)
	}
	return x, nil
}

// trimWhat drops the "sentinel: what: field: " prefix of a decoder error,
// keeping the reason.
func trimWhat(err error, field string) string {
	s := err.Error()
	prefix := worker.ErrBadMessage.Error() + ": " + field + ": " + field + ": "
	if len(s) > len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):]
	}
	return s
}

// GridConfigProto is c as the GridConfig message (nil when c does not
// encode: a negative size).
func GridConfigProto(c worker.Config) *workerv1.GridConfig {
	g, err := encodeConfig(c)
	if err != nil {
		return nil
	}
	return g
}

// GridConfigFromProto is a GridConfig message as a worker.Config,
// validated.
func GridConfigFromProto(g *workerv1.GridConfig) (worker.Config, error) {
	c, err := decodeConfig(g)
	if err != nil {
		return worker.Config{}, err
	}
	if err := c.Validate(); err != nil {
		return worker.Config{}, fmt.Errorf("%w: %w", worker.ErrBadMessage, err)
	}
	return c, nil
}
