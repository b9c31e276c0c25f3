package engine

import (
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestDevicePageBytes: the device memory of the pages is counted in the
// pages' type (the CUDA backend's pools hold K, V and the min/max
// summaries as the K/V dtype), against the byte count by hand: an 8B
// shape at 32K tokens and batch 8 in bf16 is 34.4 GB of K/V (what the
// PyTorch anchor reports) plus its summaries, not twice that.
func TestDevicePageBytes(t *testing.T) {
	for _, dt := range []plan.DType{plan.Float32, plan.BFloat16} {
		ecfg := DefaultConfig()
		ecfg.Layers, ecfg.QHeads, ecfg.KVHeads, ecfg.HeadDim, ecfg.PageSize = 32, 32, 8, 128, 16
		ecfg.CP, ecfg.TP = 1, 1
		ecfg.CapacityPages = 8 * 32768 / 16
		ecfg.Geometry.DType = dt
		got, err := ecfg.DevicePageBytes()
		if err != nil {
			t.Fatal(err)
		}
		b := int64(dt.Bytes())
		kv := int64(32) * 16384 * 2 * 8 * 16 * 128 * b // layers x pages x (K, V) x heads x slots x dims
		sum := int64(32) * 16384 * 2 * 8 * 128 * b     // layers x pages x (min, max) x heads x dims
		if got != kv+sum {
			t.Errorf("%v: DevicePageBytes %d, by hand %d (K/V %d + summaries %d)", dt, got, kv+sum, kv, sum)
		}
		if dt == plan.BFloat16 && kv != 34_359_738_368 {
			t.Errorf("bf16 K/V by hand %d bytes, the anchor's 34.36 GB", kv)
		}
	}
	// fp8: one byte per K/V element, a float32 scale per (layer, page,
	// K or V, KV head) record, float32 summaries.
	ecfg := DefaultConfig()
	ecfg.Layers, ecfg.QHeads, ecfg.KVHeads, ecfg.HeadDim, ecfg.PageSize = 32, 32, 8, 128, 16
	ecfg.CP, ecfg.TP = 1, 1
	ecfg.CapacityPages = 8 * 32768 / 16
	ecfg.Geometry.DType = plan.FP8
	got, err := ecfg.DevicePageBytes()
	if err != nil {
		t.Fatal(err)
	}
	kv := int64(32) * 16384 * 2 * 8 * (16*128 + 4) // layers x pages x (K, V) x heads x (codes + scale)
	sum := int64(32) * 16384 * 2 * 8 * 128 * 4     // layers x pages x (min, max) x heads x dims, float32
	if got != kv+sum {
		t.Errorf("fp8: DevicePageBytes %d, by hand %d (K/V %d + summaries %d)", got, kv+sum, kv, sum)
	}
	ecfg = DefaultConfig()
	ecfg.CP = 2
	if _, err := ecfg.DevicePageBytes(); err == nil {
		t.Error("pages of two ranks counted")
	}
}
