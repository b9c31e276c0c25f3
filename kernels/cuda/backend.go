//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Config configures a CUDA backend.
type Config struct {
	// Device is the CUDA device ordinal (0).
	Device int
	// DType is the storage type of the pools (NewPool) and of layers
	// uploaded from host float32 arrays (plan.Float32); plan.FP8 stores
	// K/V as fp8 records (kvfp8.go; host fp8 records upload as fp8
	// whatever DType).
	DType plan.DType
	// SummaryDType is plan.SummaryFP8 to keep an fp8 copy of every
	// pool's summaries and score from it (see FP8Summaries, fp8.go);
	// plan.SummaryKV (the default) scores the DType records.
	SummaryDType plan.SummaryDType
	// AttendChunk is the number of pages per attention work item
	// (split-K); 0 sizes items to fill the GPU (2 to 64 pages).
	AttendChunk int
	// OwnGemm runs the projections of prompt chunks on the backend's own
	// tensor-core GEMM (prefill.cu) even where cuBLAS is found (default:
	// cuBLAS when QUESTRT_CUBLAS or the loader finds it; see cublas.go).
	OwnGemm bool
	// PrefillKernel names the prefill attention variant (AttendKernels,
	// e.g. "prefill_attend_bf16_d128_m2n64w8") for calls whose pages and
	// head dimension it fits; "" or a variant that does not fit takes the
	// default. For tuning and benchmarks.
	PrefillKernel string
	// ScoreChunk is the number of pages per scoring block; 0 sizes blocks
	// to fill the GPU.
	ScoreChunk int
	// AttendKernel and ScoreKernel name a tensor-core kernel variant of
	// mma.cu to use instead of the default (for tuning and benchmarks,
	// e.g. "quest_attendmma_bf16_d128_w4s2"); "" picks the default. A name
	// that does not fit the call's shape is an error. ScoreKernel
	// ScoreFP8CUDACores scores fp8 summaries with the CUDA-core kernels.
	AttendKernel, ScoreKernel string
	// TopKPath forces the top-K kernel for tuning and benchmarks: "thr"
	// (the threshold kernel, one block per row), "twostage", "radix" (the
	// multi-block select for long rows) or "onestage" (the radix select,
	// one block per row); "" lets the dispatch choose. A plan the forced
	// kernel does not take (twostage: rows too short or k too large;
	// radix: k over 4,096) runs the dispatch's choice.
	TopKPath string
	// AlwaysUpload copies a call's packed arrays and an append's touched
	// pages to the device even when the device already holds the same
	// bytes from the previous such call (default false: that copy is
	// skipped, see keptCopy). For benchmarks' side-by-side runs.
	AlwaysUpload bool
}

// topkPaths are the values of Config.TopKPath.
var topkPaths = []string{"", "thr", "twostage", "radix", "onestage"}

// Backend runs the Quest kernels on one GPU. One goroutine, locked to its
// OS thread, creates the CUDA context and the modules and tears them down
// at Close; each method call takes the backend's one turn and runs its
// CUDA work on the caller's own OS thread (locked for the call) with the
// context made current there, so a Backend is safe for concurrent use
// (calls serialize) and a call costs no goroutine handoff (measured on an
// H200 host: 16.7 us per call through a channel to the locked goroutine).
// Several Backends may share a GPU (one context each).
type Backend struct {
	cfg    Config
	cuctx  cu.CUContext
	turn   chan struct{} // one slot: held by the call in progress
	closed bool          // set by Close while it holds the turn
	quit   chan struct{}
	done   chan struct{}

	// Owned by the call holding the turn (the "device goroutine" below).
	fn         map[string]cu.Function
	smem       map[string]int // dynamic shared memory of the tensor-core attention kernels
	warps      map[string]int // warps per block of the tensor-core attention kernels
	bufs       map[string]devBuf
	argv       [maxParams]uint64 // kernel parameters of the launch in progress
	modelPDL   bool              // model kernels launched as programmatic dependents (SetModelPDL)
	gemmKernel GemmKernel        // the prefill GEMM variant (SetGemm; defaultGemm)
	blas       *cublas           // cuBLAS once opened (device goroutine)
	blasErr    error             // why cuBLAS is not used (after the first try)
	blasTried  bool
	items      [5][]int32 // attention work items: sequence, row, list lo, list hi; row -> first item
	// Pinned staging buffer for uploads and outputs: bytes [0, stageOff)
	// are handed out; staged is set while an asynchronous copy or a kernel
	// may read or write it. pending are the outputs of queued steps
	// (StepQueued) still in it, copied out by settle.
	pin      pinned
	stageOff int64
	staged   bool
	pending  []pendingOut
	// stageWraps counts the synchronizations stage made to start the
	// buffer over (tests).
	stageWraps int
	// kept are the scratch buffers whose uploads are skipped when the
	// device holds the same bytes (keptCopy), by name; skipped counts the
	// uploads skipped (tests).
	kept    map[string]*keptCopy
	skipped int
	image   []byte       // send's image of the packed arrays (keptCopy)
	host    *DeviceLayer // scratch layer for host-array inputs
	slotIn  []int32      // WriteSlotTable's upload: pages, then slots
	slotIn2 []int32      // and its slots, before they join

	// One upload and one download per attention or step call: b.in packs
	// the inputs, b.out lays out o, lse and the lists (regions outO,
	// outLSE, outLists).
	in, out    packed
	tabs       []int32 // device table addresses of a batch, as int32 pairs
	rankOut    []int32 // Rank's download of the chosen pages
	rankScores []float32

	stepMu    sync.Mutex // guards stepCheck (used outside the device goroutine)
	stepCheck kernels.StepCheck

	probe *stepProbe // events around each Step's device work (benchmarks only), or nil
	marks []cu.Event // phase marks queued since the last PhaseTimes (phase.go)
}

type devBuf struct {
	ptr  cu.DevicePtr
	size int64
}

var (
	_ kernels.Backend       = (*Backend)(nil)
	_ kernels.DeviceStore   = (*Backend)(nil)
	_ kernels.Stepper       = (*Backend)(nil)
	_ kernels.QueuedStepper = (*Backend)(nil)
	_ kernels.Ranker        = (*Backend)(nil)
)

// New starts a backend on cfg.Device: creates a context on a locked OS
// thread and loads the embedded PTX.
func New(cfg Config) (*Backend, error) {
	if !slices.Contains(topkPaths, cfg.TopKPath) {
		return nil, fmt.Errorf("cuda: top-K path %q: want thr, twostage, radix or onestage", cfg.TopKPath)
	}
	b := &Backend{cfg: cfg, turn: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		gemmKernel: defaultGemm, fn: map[string]cu.Function{}, smem: map[string]int{}, warps: map[string]int{}, bufs: map[string]devBuf{},
		kept: map[string]*keptCopy{keptCallIn: {}, keptAppendPages: {}}}
	ready := make(chan error, 1)
	go b.loop(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return b, nil
}

func (b *Backend) loop(ready chan<- error) {
	defer close(b.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dev, err := cu.GetDevice(b.cfg.Device)
	if err != nil {
		ready <- fmt.Errorf("cuda: device %d: %w", b.cfg.Device, err)
		return
	}
	ctx, err := dev.MakeContext(cu.SchedAuto)
	if err != nil {
		ready <- fmt.Errorf("cuda: context on device %d: %w", b.cfg.Device, err)
		return
	}
	defer ctx.Destroy()
	b.cuctx = ctx
	mod, err := cu.LoadData(PTX)
	if err != nil {
		ready <- fmt.Errorf("cuda: load PTX: %w", err)
		return
	}
	defer mod.Unload()
	mmaMod, err := cu.LoadData(PTXMMA)
	if err != nil {
		ready <- fmt.Errorf("cuda: load tensor-core PTX: %w", err)
		return
	}
	defer mmaMod.Unload()
	for _, k := range mmaKernels() {
		f, err := mmaMod.Function(k.name)
		if err != nil {
			ready <- fmt.Errorf("cuda: kernel %s: %w", k.name, err)
			return
		}
		if k.attend {
			// Always opt in: with the kernel's static shared memory even
			// exactly 48 KiB of dynamic shared memory needs it.
			if err := setMaxDynamicSmem(f, k.smem); err != nil {
				ready <- fmt.Errorf("cuda: kernel %s: %w", k.name, err)
				return
			}
		}
		b.fn[k.name] = f
		b.smem[k.name] = k.smem
		b.warps[k.name] = k.warps
	}
	names := append(questKernelNames(), fp8KernelNames()...)
	for _, n := range names {
		f, err := mod.Function(n)
		if err != nil {
			ready <- fmt.Errorf("cuda: kernel %s: %w", n, err)
			return
		}
		b.fn[n] = f
	}
	slotsMod, err := loadSlotKernels(b.fn)
	if err != nil {
		ready <- err
		return
	}
	defer slotsMod.Unload()
	modelMod, err := loadModelKernels(b.fn)
	if err != nil {
		ready <- err
		return
	}
	defer modelMod.Unload()
	prefillMod, err := loadPrefillKernels(b.fn)
	if err != nil {
		ready <- err
		return
	}
	defer prefillMod.Unload()
	ready <- nil
	<-b.quit // Close holds the turn: no call runs
	b.blas.close()
	for _, bf := range b.bufs {
		cu.MemFree(bf.ptr)
	}
	b.pin.free()
}

// do runs f holding the backend's turn, on the calling goroutine locked to
// its OS thread with the backend's context current there, and returns its
// error; waiting for the turn ends with ctx.
func (b *Backend) do(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case b.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-b.turn }()
	if b.closed {
		return kernels.ErrClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// The thread's current context is put back after the call (a caller
	// may have its own).
	if prev, err := cu.CurrentContext(); err != nil || prev != b.cuctx {
		if err := cu.SetCurrentContext(b.cuctx); err != nil {
			return fmt.Errorf("cuda: make the context current: %w", err)
		}
		if err == nil {
			defer cu.SetCurrentContext(prev)
		}
	}
	return f()
}

// Name returns "cuda".
func (b *Backend) Name() string { return "cuda" }

// Close frees the device buffers and the context.
func (b *Backend) Close() error {
	b.turn <- struct{}{} // waits for the call in progress
	defer func() { <-b.turn }()
	if b.closed {
		return nil
	}
	b.closed = true
	close(b.quit)
	<-b.done
	return nil
}

// Number of multiprocessors the work-size heuristics aim to fill (H200:
// 132); a guess is fine, it only sizes work items.
const targetSMs = 132
