//go:build cuda

package gpu

import (
	"context"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/plan"
)

// TestPageBytesOnDevice: the device memory an engine of device-resident
// pages takes on the CUDA backend (MemInfo before and after engine.New)
// is what engine.Config.DevicePageBytes says, in float32 and bf16, within the driver's
// allocation granularity.
func TestPageBytesOnDevice(t *testing.T) {
	ctx := context.Background()
	for _, dt := range []plan.DType{plan.Float32, plan.BFloat16} {
		be, err := cuda.New(cuda.Config{DType: dt})
		if err != nil {
			t.Fatal(err)
		}
		ecfg := engine.DefaultConfig()
		ecfg.Layers, ecfg.QHeads, ecfg.KVHeads, ecfg.HeadDim, ecfg.PageSize = 8, 32, 8, 128, 16
		ecfg.CP, ecfg.TP, ecfg.CapacityPages = 1, 1, 4096
		ecfg.Geometry.DType = dt
		ecfg.Backend, ecfg.DeviceResident = be, true
		want, err := ecfg.DevicePageBytes()
		if err != nil {
			t.Fatal(err)
		}
		free0, _, err := be.MemInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.New(ecfg)
		if err != nil {
			t.Fatal(err)
		}
		free1, _, err := be.MemInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := free0 - free1
		t.Logf("%v: %d pages take %.1f MB on the device, DevicePageBytes %.1f MB", dt, ecfg.CapacityPages, float64(got)/1e6, float64(want)/1e6)
		if slack := int64(64 << 20); got < want || got > want+slack {
			t.Errorf("%v: the pages took %d bytes, DevicePageBytes says %d (+ up to %d of allocation granularity and staging)", dt, got, want, slack)
		}
		e.Close()
		be.Close()
	}
}
