//go:build cuda

package gpudecode

import (
	"testing"

	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/plan"
)

// TestAppendTensorOnDevice: random K/V made on the GPU and appended
// through engine.AppendTensor (bench decode's fill) leave sequences
// whose steps equal bit for bit those of the same values appended from
// the host, in bf16, f32 and fp8 pages.
func TestAppendTensorOnDevice(t *testing.T) {
	for _, dt := range []plan.DType{plan.BFloat16, plan.Float32, plan.FP8} {
		be, err := cuda.New(cuda.Config{DType: dt})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		e, id := appendTensorEngine(t, be, dt)
		checkAppendTensor(t, be, e, id, be, dt)
	}
}
