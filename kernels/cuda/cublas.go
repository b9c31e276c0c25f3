//go:build cuda

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

// The few cuBLAS entry points the prefill GEMM uses, resolved at run time
// (dlopen) so that a build needs neither cuBLAS's headers nor its
// library; the prototypes are cuBLAS's (cublas_api.h, v2 API).
typedef int (*questCublasCreate)(void**);
typedef int (*questCublasDestroy)(void*);
typedef int (*questCublasSetStream)(void*, void*);
typedef int (*questCublasGemmEx)(void*, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int,
				  const void*, void*, int, int, int, int);

typedef struct {
	void* lib;
	questCublasCreate create;
	questCublasDestroy destroy;
	questCublasSetStream setStream;
	questCublasGemmEx gemmEx;
} questCublas;

static int questCublasOpen(questCublas* c, const char* path) {
	c->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!c->lib) return 1;
	c->create = (questCublasCreate)dlsym(c->lib, "cublasCreate_v2");
	c->destroy = (questCublasDestroy)dlsym(c->lib, "cublasDestroy_v2");
	c->setStream = (questCublasSetStream)dlsym(c->lib, "cublasSetStream_v2");
	c->gemmEx = (questCublasGemmEx)dlsym(c->lib, "cublasGemmEx");
	if (!c->create || !c->destroy || !c->setStream || !c->gemmEx) {
		dlclose(c->lib);
		c->lib = 0;
		return 2;
	}
	return 0;
}

static const char* questDlerror(void) {
	const char* e = dlerror();
	return e ? e : "";
}

static int questCublasCreateHandle(questCublas* c, void** h) { return c->create(h); }
static int questCublasDestroyHandle(questCublas* c, void* h) { return c->destroy(h); }
static int questCublasDefaultStream(questCublas* c, void* h) { return c->setStream(h, 0); }

// questCublasGemm: y[M][N] (float32, row-major, leading dimension ldy)
// = x[M][K] w[N][K]^T (bf16, row-major) + beta y. In cuBLAS's column-major
// terms y^T (N x M) = w (op T of a K x N matrix) x^T (K x M).
static int questCublasGemm(questCublas* c, void* h, int M, int N, int K, uint64_t w, uint64_t x, uint64_t y, int ldy, float beta) {
	const float alpha = 1.f;
	return c->gemmEx(h, 1, 0, N, M, K, &alpha, (const void*)w, 14, K, (const void*)x, 14, K, &beta, (void*)y, 0, ldy, 68, -1);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"
)

// cuBLAS for the projections of a prompt chunk: cublasGemmEx of bf16
// inputs into float32 outputs with float32 accumulation, on the
// backend's stream. cuBLAS is found at run time (dlopen): QUESTRT_CUBLAS
// names the library file; else libcublas.so.13, .12 and libcublas.so on
// the loader's path. Without it the backend runs its own tensor-core GEMM
// (prefill.cu).

// cublasNames are the library names tried when QUESTRT_CUBLAS is unset.
var cublasNames = []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so"}

// cublas is an open cuBLAS handle on the backend's context (device
// goroutine only).
type cublas struct {
	lib    C.questCublas
	handle unsafe.Pointer
	path   string
}

// openCublas loads cuBLAS and makes a handle in the current context; an
// error names every file tried.
func openCublas() (*cublas, error) {
	names := cublasNames
	if p := os.Getenv("QUESTRT_CUBLAS"); p != "" {
		names = []string{p}
	}
	c := &cublas{}
	var tried []string
	for _, n := range names {
		cs := C.CString(n)
		r := C.questCublasOpen(&c.lib, cs)
		C.free(unsafe.Pointer(cs))
		if r == 0 {
			c.path = n
			break
		}
		msg := "missing cublasCreate_v2, cublasDestroy_v2, cublasSetStream_v2 or cublasGemmEx"
		if r == 1 {
			msg = C.GoString(C.questDlerror())
		}
		tried = append(tried, fmt.Sprintf("%s (%s)", n, msg))
	}
	if c.path == "" {
		return nil, fmt.Errorf("cuda: no cuBLAS: %s", strings.Join(tried, "; "))
	}
	var h unsafe.Pointer
	if r := C.questCublasCreateHandle(&c.lib, &h); r != 0 {
		return nil, fmt.Errorf("cuda: cublasCreate (%s): status %d", c.path, int(r))
	}
	if r := C.questCublasDefaultStream(&c.lib, h); r != 0 {
		C.questCublasDestroyHandle(&c.lib, h)
		return nil, fmt.Errorf("cuda: cublasSetStream (%s): status %d", c.path, int(r))
	}
	c.handle = h
	return c, nil
}

// gemm queues y = x w^T (+ y when accumulate) for m rows: x [m][k] and
// w [n][k] bf16, y float32 with rows ldy floats apart.
func (c *cublas) gemm(m, n, k int, w, x, y uint64, ldy int, accumulate bool) error {
	beta := C.float(0)
	if accumulate {
		beta = 1
	}
	if r := C.questCublasGemm(&c.lib, c.handle, C.int(m), C.int(n), C.int(k), C.uint64_t(w), C.uint64_t(x), C.uint64_t(y), C.int(ldy), beta); r != 0 {
		return fmt.Errorf("cuda: cublasGemmEx %d x %d x %d: status %d", m, n, k, int(r))
	}
	return nil
}

func (c *cublas) close() error {
	if c == nil || c.handle == nil {
		return nil
	}
	r := C.questCublasDestroyHandle(&c.lib, c.handle)
	c.handle = nil
	if r != 0 {
		return errors.New("cuda: cublasDestroy failed")
	}
	return nil
}
