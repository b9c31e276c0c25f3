//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <cudaProfiler.h>
#include <stdint.h>
#include <string.h>

static CUresult questSetMaxDynamicSmem(CUfunction f, int bytes) {
	return cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
}

// questLaunch launches f on the default stream with n 8-byte parameters
// taken from args (the pointer array lives on this C stack frame, so a
// launch allocates nothing).
static CUresult questLaunch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned smem,
			    uint64_t* args, int n) {
	void* p[32];
	for (int i = 0; i < n && i < 32; i++) p[i] = &args[i];
	return cuLaunchKernel(f, gx, gy, gz, bx, 1, 1, smem, (CUstream)0, p, 0);
}

// Programmatic dependent launch (sm_90): the launch may overlap the
// previous kernel in the stream until the kernel executes
// griddepcontrol.wait.
static CUresult questLaunchPDL(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned smem,
			       uint64_t* args, int n) {
	void* p[32];
	for (int i = 0; i < n && i < 32; i++) p[i] = &args[i];
	CUlaunchAttribute a;
	memset(&a, 0, sizeof a);
	a.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
	a.value.programmaticStreamSerializationAllowed = 1;
	CUlaunchConfig c;
	memset(&c, 0, sizeof c);
	c.gridDimX = gx; c.gridDimY = gy; c.gridDimZ = gz;
	c.blockDimX = bx; c.blockDimY = 1; c.blockDimZ = 1;
	c.sharedMemBytes = smem;
	c.hStream = (CUstream)0;
	c.attrs = &a;
	c.numAttrs = 1;
	return cuLaunchKernelEx(&c, f, p, 0);
}

static CUresult questHostAlloc(void** p, size_t n) { return cuMemHostAlloc(p, n, CU_MEMHOSTALLOC_DEVICEMAP); }
static CUresult questHostDevPtr(CUdeviceptr* d, void* p) { return cuMemHostGetDevicePointer(d, p, 0); }
static CUresult questHostFree(void* p) { return cuMemFreeHost(p); }
*/
import "C"

import (
	"context"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"
)

// The driver calls gorgonia.org/cu v0.9.6 does not wrap, or wraps with an
// allocation per call (two C mallocs per kernel launch). cu.Function holds the CUfunction handle as its only
// field.

func cfunc(f cu.Function) C.CUfunction { return *(*C.CUfunction)(unsafe.Pointer(&f)) }

// setMaxDynamicSmem lets launches of f use up to bytes of dynamic shared
// memory (above the default 48 KiB). Device goroutine only.
func setMaxDynamicSmem(f cu.Function, bytes int) error {
	if r := C.questSetMaxDynamicSmem(cfunc(f), C.int(bytes)); r != C.CUDA_SUCCESS {
		return fmt.Errorf("cuda: cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, %d): CUresult %d", bytes, int(r))
	}
	return nil
}

// ProfilerStart and ProfilerStop bracket the device work a profiler
// started with capture off records (ncu --profile-from-start off, nsys
// --capture-range=cudaProfilerApi): cuProfilerStart and cuProfilerStop.
// Without a profiler attached they do nothing.
func (b *Backend) ProfilerStart(ctx context.Context) error {
	return b.do(ctx, func() error {
		if r := C.cuProfilerStart(); r != C.CUDA_SUCCESS {
			return fmt.Errorf("cuda: cuProfilerStart: CUresult %d", int(r))
		}
		return nil
	})
}

// ProfilerStop ends the range ProfilerStart began.
func (b *Backend) ProfilerStop(ctx context.Context) error {
	return b.do(ctx, func() error {
		if r := C.cuProfilerStop(); r != C.CUDA_SUCCESS {
			return fmt.Errorf("cuda: cuProfilerStop: CUresult %d", int(r))
		}
		return nil
	})
}

// maxParams is the most kernel parameters launchArgs passes.
const maxParams = 32

// launchArgs launches f with the 8-byte parameters args (at most
// maxParams) on the default stream, without allocating.
func launchArgs(f cu.Function, grid [3]int, block, shared int, args *[maxParams]uint64, n int) error {
	if r := C.questLaunch(cfunc(f), C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]), C.uint(block), C.uint(shared),
		(*C.uint64_t)(unsafe.Pointer(&args[0])), C.int(n)); r != C.CUDA_SUCCESS {
		return fmt.Errorf("CUresult %d", int(r))
	}
	return nil
}

// launchArgsPDL is launchArgs with programmatic stream serialization
// (cuLaunchKernelEx, CUDA 11.8+ drivers): the kernel may start while the
// previous kernel in the stream drains, and must execute
// griddepcontrol.wait before it reads that kernel's output.
func launchArgsPDL(f cu.Function, grid [3]int, block, shared int, args *[maxParams]uint64, n int) error {
	if r := C.questLaunchPDL(cfunc(f), C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]), C.uint(block), C.uint(shared),
		(*C.uint64_t)(unsafe.Pointer(&args[0])), C.int(n)); r != C.CUDA_SUCCESS {
		return fmt.Errorf("CUresult %d", int(r))
	}
	return nil
}

// pinned is page-locked host memory (cuMemHostAlloc), which host-device
// copies read or write directly and asynchronously, mapped into the
// device's address space at dev (kernels write it directly).
type pinned struct {
	p    unsafe.Pointer
	size int64
	dev  cu.DevicePtr
}

func allocPinned(size int64) (pinned, error) {
	var p unsafe.Pointer
	if r := C.questHostAlloc(&p, C.size_t(size)); r != C.CUDA_SUCCESS {
		return pinned{}, fmt.Errorf("cuda: cuMemHostAlloc(%d): CUresult %d", size, int(r))
	}
	var d C.CUdeviceptr
	if r := C.questHostDevPtr(&d, p); r != C.CUDA_SUCCESS {
		C.questHostFree(p)
		return pinned{}, fmt.Errorf("cuda: cuMemHostGetDevicePointer: CUresult %d", int(r))
	}
	return pinned{p, size, cu.DevicePtr(d)}, nil
}

// devAt is the device address of host address p inside h.
func (h *pinned) devAt(p unsafe.Pointer) cu.DevicePtr {
	return h.dev + cu.DevicePtr(uintptr(p)-uintptr(h.p))
}

func (h *pinned) free() {
	if h.p != nil {
		C.questHostFree(h.p)
		h.p, h.size, h.dev = nil, 0, 0
	}
}

// bytes views the first n bytes of h.
func (h *pinned) bytes(n int64) []byte { return unsafe.Slice((*byte)(h.p), n) }
