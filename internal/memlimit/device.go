package memlimit

import (
	"context"
	"fmt"
	"math"
)

// DeviceMemory reports a device's memory: kernels.ModelDevice's MemInfo
// (the CUDA backend's cuMemGetInfo, or its CPU twin's pretend memory).
type DeviceMemory interface {
	MemInfo(ctx context.Context) (free, total int64, err error)
}

// DefaultDeviceFraction is vLLM's default gpu_memory_utilization: the
// share of a GPU's total memory that one server may take in all.
const DefaultDeviceFraction = 0.9

// DeviceBudget is the device memory that what is allocated last (a
// serving pool's pages, an offload's device slots) may take, read once
// the rest (the executor's weights and workspace) is allocated, by vLLM's
// gpu_memory_utilization rule: the process takes at most Fraction of the
// device's Total in all, so the budget is Fraction x Total less what is
// used already (Total - Free: the weights, workspace and anything else
// on the device, other processes included); with Fraction <= 1 that is
// never more than Free.
type DeviceBudget struct {
	// Free and Total are the device's memory when it was read (bytes).
	Free, Total int64
	// Fraction is the share of Total the process may take in all.
	Fraction float64
	// Bytes is the budget: floor(Fraction x Total) - (Total - Free), at
	// least 0.
	Bytes int64
}

// ReadDevice reads d's memory now and returns the budget of fraction
// (0 < fraction <= 1) of its total.
func ReadDevice(ctx context.Context, d DeviceMemory, fraction float64) (DeviceBudget, error) {
	if !(fraction > 0 && fraction <= 1) {
		return DeviceBudget{}, fmt.Errorf("memlimit: device memory fraction %v: want 0 < f <= 1", fraction)
	}
	free, total, err := d.MemInfo(ctx)
	if err != nil {
		return DeviceBudget{}, fmt.Errorf("memlimit: device memory: %w", err)
	}
	return NewDeviceBudget(free, total, fraction), nil
}

// NewDeviceBudget is the budget of fraction of a device with free of
// total bytes free (ReadDevice's arithmetic).
func NewDeviceBudget(free, total int64, fraction float64) DeviceBudget {
	b := DeviceBudget{Free: free, Total: total, Fraction: fraction}
	b.Bytes = max(int64(math.Floor(float64(total)*fraction))-(total-free), 0)
	return b
}

// Fit returns the most n >= 0 with fixed + n x per <= b.Bytes (0 when
// not even fixed fits, or per is not positive).
func (b DeviceBudget) Fit(fixed, per int64) int64 {
	if per <= 0 || b.Bytes <= fixed {
		return 0
	}
	return (b.Bytes - fixed) / per
}
