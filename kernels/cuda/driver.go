//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>

static CUresult questSetMaxDynamicSmem(CUfunction f, int bytes) {
	return cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"gorgonia.org/cu"
)

// The driver calls gorgonia.org/cu v0.9.6 does not wrap. cu.Function holds
// the CUfunction handle as its only field.

// setMaxDynamicSmem lets launches of f use up to bytes of dynamic shared
// memory (above the default 48 KiB). Device goroutine only.
func setMaxDynamicSmem(f cu.Function, bytes int) error {
	h := *(*C.CUfunction)(unsafe.Pointer(&f))
	if r := C.questSetMaxDynamicSmem(h, C.int(bytes)); r != C.CUDA_SUCCESS {
		return fmt.Errorf("cuda: cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, %d): CUresult %d", bytes, int(r))
	}
	return nil
}
