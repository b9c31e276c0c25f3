//go:build cuda

package cuda

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"sort"
	"sync"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Config configures a CUDA backend.
type Config struct {
	// Device is the CUDA device ordinal (0).
	Device int
	// DType is the storage type of layers uploaded from host arrays (plan.Float32).
	DType plan.DType
	// SummaryDType is plan.SummaryFP8 to keep an fp8 copy of every
	// pool's summaries and score from it (see FP8Summaries, fp8.go);
	// plan.SummaryKV (the default) scores the DType records.
	SummaryDType plan.SummaryDType
	// AttendChunk is the number of pages per attention work item
	// (split-K); 0 sizes items to fill the GPU (2 to 64 pages).
	AttendChunk int
	// ScoreChunk is the number of pages per scoring block; 0 sizes blocks
	// to fill the GPU.
	ScoreChunk int
	// AttendKernel and ScoreKernel name a tensor-core kernel variant of
	// mma.cu to use instead of the default (for tuning and benchmarks,
	// e.g. "quest_attendmma_bf16_d128_w4s2"); "" picks the default. A name
	// that does not fit the call's shape is an error. ScoreKernel
	// ScoreFP8CUDACores scores fp8 summaries with the CUDA-core kernels.
	AttendKernel, ScoreKernel string
}

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
	fn    map[string]cu.Function
	smem  map[string]int // dynamic shared memory of the tensor-core attention kernels
	warps map[string]int // warps per block of the tensor-core attention kernels
	bufs  map[string]devBuf
	argv  [maxParams]uint64 // kernel parameters of the launch in progress
	items [5][]int32        // attention work items: sequence, row, list lo, list hi; row -> first item
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
	host       *DeviceLayer // scratch layer for host-array inputs

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

// DeviceLayer is one layer's page pool in device memory, laid out like the
// CPU pool ([pages][KVHeads][S][D] for K and V, [pages][KVHeads][2][D] for
// summaries) in DType. Pass it as kernels.Layer.Device.
//
// Slots > 0 makes it a slot pool (kernels.SlotStore, slots.go): K and V
// then hold Slots pages, indexed by device slot, and Summary holds Pages
// pages, indexed by physical page.
type DeviceLayer struct {
	K, V, Summary                     cu.DevicePtr
	Pages, KVHeads, HeadDim, PageSize int
	DType                             plan.DType
	Slots                             int
	FP8                               *FP8Summaries // fp8 copy of the summaries (fp8.go), or nil
}

// kvPages is the number of pages K and V hold: Slots for a slot pool,
// else Pages.
func (l *DeviceLayer) kvPages() int {
	if l.Slots > 0 {
		return l.Slots
	}
	return l.Pages
}

// New starts a backend on cfg.Device: creates a context on a locked OS
// thread and loads the embedded PTX.
func New(cfg Config) (*Backend, error) {
	b := &Backend{cfg: cfg, turn: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		fn: map[string]cu.Function{}, smem: map[string]int{}, warps: map[string]int{}, bufs: map[string]devBuf{}}
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
	names := []string{"quest_topk", "quest_topk_thr", "quest_topk_radix", "quest_topk_sample_t1024", "quest_topk_sample_t512", "quest_topk_sample_t256", "quest_topk_local", "quest_topk_merge", "quest_reduce", "quest_merge", "quest_gather_tables", "quest_pick_scores"}
	for _, dt := range []plan.DType{plan.Float32, plan.Float16, plan.BFloat16} {
		for _, k := range []string{"convert", "append", "score", "attend", "fill", "summarize", "rescan"} {
			names = append(names, "quest_"+k+"_"+dt.String())
		}
		for _, g := range []int{1, 2, 4, 8} {
			names = append(names, fmt.Sprintf("quest_score128_%s_g%d", dt, g))
		}
		for _, d := range []int{64, 128} {
			names = append(names, fmt.Sprintf("quest_attendp_%s_d%d", dt, d))
			if dt != plan.Float32 {
				names = append(names, fmt.Sprintf("quest_attends16_%s_d%d", dt, d))
			}
		}
		if dt != plan.Float32 {
			names = append(names, "quest_score128g4_"+dt.String())
		}
	}
	names = append(names, fp8KernelNames()...)
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
	ready <- nil
	<-b.quit // Close holds the turn: no call runs
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

// ---- device helpers (device goroutine only) ----

// buf returns a scratch buffer named name of at least n bytes.
func (b *Backend) buf(name string, n int64) (cu.DevicePtr, error) {
	n = max(n, 256)
	if bf, ok := b.bufs[name]; ok && bf.size >= n {
		return bf.ptr, nil
	} else if ok {
		cu.MemFree(bf.ptr)
		delete(b.bufs, name)
	}
	size := int64(1)
	for size < n {
		size <<= 1
	}
	p, err := cu.MemAlloc(size)
	if err != nil {
		return 0, fmt.Errorf("cuda: alloc %d bytes for %s: %w", size, name, err)
	}
	b.bufs[name] = devBuf{p, size}
	return p, nil
}

// upload copies s into the scratch device buffer named name through the
// pinned staging buffer, asynchronously on the default stream (the copy is
// ordered before later launches; the staging space is reused only after a
// synchronizing download or cu.Synchronize).
func upload[T int32 | float32](b *Backend, name string, s []T) (cu.DevicePtr, error) {
	n := int64(len(s)) * 4
	p, err := b.buf(name, n)
	if err != nil || len(s) == 0 {
		return p, err
	}
	src, err := b.stage(n)
	if err != nil {
		return 0, err
	}
	copy(unsafe.Slice((*T)(src), len(s)), s)
	if err := cu.MemcpyHtoDAsync(p, src, n, cu.Stream{}); err != nil {
		return 0, fmt.Errorf("cuda: upload %s: %w", name, err)
	}
	b.staged = true
	return p, nil
}

// stage returns n bytes of the pinned staging buffer after the ones handed
// out since the last synchronization, growing the buffer (or synchronizing
// and starting over) when they do not fit.
func (b *Backend) stage(n int64) (unsafe.Pointer, error) {
	off := (b.stageOff + 255) &^ 255
	if off+n > b.pin.size {
		if b.staged {
			if err := cu.Synchronize(); err != nil {
				return nil, fmt.Errorf("cuda: synchronize before reusing the staging buffer: %w", err)
			}
			b.settle()
			b.stageWraps++
		}
		off = 0
		if n > b.pin.size {
			size := max(n, 2*b.pin.size, 1<<20)
			b.pin.free()
			var err error
			if b.pin, err = allocPinned(size); err != nil {
				return nil, err
			}
		}
	}
	b.stageOff = off + n
	return unsafe.Add(b.pin.p, off), nil
}

// download copies src into dst synchronously; every copy and kernel queued
// before it is then done, so the staging buffer starts over.
func download[T int32 | float32](b *Backend, dst []T, src cu.DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	if err := cu.MemcpyDtoH(unsafe.Pointer(&dst[0]), src, int64(len(dst))*4); err != nil {
		return fmt.Errorf("cuda: download: %w", err)
	}
	b.settle()
	return nil
}

// pendingOut is one output of a queued step: n floats at src in the
// staging buffer, for dst.
type pendingOut struct {
	dst []float32
	src unsafe.Pointer
}

// settle follows a synchronization that finished every queued copy and
// kernel: it copies the queued steps' outputs out of the staging buffer
// and starts the buffer over.
func (b *Backend) settle() {
	for _, p := range b.pending {
		copy(p.dst, unsafe.Slice((*float32)(p.src), len(p.dst)))
	}
	clear(b.pending) // keep no reference to the callers' arrays
	b.pending = b.pending[:0]
	b.staged, b.stageOff = false, 0
}

// packed collects the host arrays of one call so that they travel in one
// copy: each array gets a 256-byte aligned place in one pinned staging
// block and in one device buffer (small copies cost a few microseconds
// each on the stream, whatever their size).
type packed struct {
	srcs  [maxPacked]unsafe.Pointer
	offs  [maxPacked]int64
	sizes [maxPacked]int64
	n     int
	total int64
	base  cu.DevicePtr   // after send (or the device address of host)
	host  unsafe.Pointer // the staging block of an output layout (prepareAttend)
}

const maxPacked = 20

func (p *packed) reset() {
	clear(p.srcs[:p.n]) // no reference to a caller's arrays survives a failed call
	p.n, p.total, p.base, p.host = 0, 0, 0, nil
}

// region appends a place of size bytes with no host array yet and returns
// its index.
func (p *packed) region(size int64) int {
	i := p.n
	p.srcs[i], p.sizes[i], p.offs[i] = nil, size, p.total
	p.total += (size + 255) &^ 255
	p.n++
	return i
}

// pack appends s and returns its index (device goroutine only).
func pack[T int32 | float32](p *packed, s []T) int {
	i := p.region(int64(len(s)) * 4)
	if len(s) > 0 {
		p.srcs[i] = unsafe.Pointer(&s[0])
	}
	return i
}

// setHost points region i at the host array s (for receive).
func setHost[T int32 | float32](p *packed, i int, s []T) {
	p.srcs[i], p.sizes[i] = nil, 0
	if len(s) > 0 {
		p.srcs[i], p.sizes[i] = unsafe.Pointer(&s[0]), int64(len(s))*4
	}
}

// ptr is the device address of array i after send.
func (p *packed) ptr(i int) cu.DevicePtr { return p.base + cu.DevicePtr(p.offs[i]) }

// send copies the packed arrays into the scratch device buffer name in one
// asynchronous copy through the staging buffer.
func (b *Backend) send(p *packed, name string) error {
	dev, err := b.buf(name, p.total)
	if err != nil {
		return err
	}
	p.base = dev
	if p.total == 0 {
		return nil
	}
	host, err := b.stage(p.total)
	if err != nil {
		return err
	}
	for i := range p.n {
		if p.sizes[i] > 0 {
			copy(unsafe.Slice((*byte)(unsafe.Add(host, p.offs[i])), p.sizes[i]), unsafe.Slice((*byte)(p.srcs[i]), p.sizes[i]))
		}
	}
	clear(p.srcs[:p.n]) // keep no reference to the caller's arrays
	if err := cu.MemcpyHtoDAsync(dev, host, p.total, cu.Stream{}); err != nil {
		return fmt.Errorf("cuda: upload %s: %w", name, err)
	}
	b.staged = true
	return nil
}

// receive copies the packed regions of the device buffer at p.base back
// into the host arrays in one synchronous copy (p describes the layout of
// both; the host arrays are the destinations). Every queued copy and
// kernel is then done, so the staging buffer starts over.
func (b *Backend) receive(p *packed) error {
	if p.total == 0 {
		return nil
	}
	host, err := b.stage(p.total)
	if err != nil {
		return err
	}
	if err := cu.MemcpyDtoH(host, p.base, p.total); err != nil {
		return fmt.Errorf("cuda: download: %w", err)
	}
	b.settle() // host stays valid until the next stage
	for i := range p.n {
		if p.sizes[i] > 0 {
			copy(unsafe.Slice((*byte)(p.srcs[i]), p.sizes[i]), unsafe.Slice((*byte)(unsafe.Add(host, p.offs[i])), p.sizes[i]))
		}
	}
	clear(p.srcs[:p.n]) // keep no reference to the caller's arrays
	return nil
}

// launch launches kernel name on the default stream with the 8-byte
// parameters args (device goroutine only; a grid with a zero dimension
// launches nothing).
func (b *Backend) launch(name string, grid [3]int, block, shared int, args ...uint64) error {
	return b.launchMode(false, name, grid, block, shared, args...)
}

// launchMode launches name, as a programmatic dependent of the previous
// kernel when pdl is set (the kernel must then wait with
// griddepcontrol.wait before reading that kernel's output).
func (b *Backend) launchMode(pdl bool, name string, grid [3]int, block, shared int, args ...uint64) error {
	f, ok := b.fn[name]
	if !ok {
		return fmt.Errorf("cuda: no kernel %s", name)
	}
	if grid[0] == 0 || grid[1] == 0 || grid[2] == 0 {
		return nil
	}
	if len(args) > maxParams {
		return fmt.Errorf("cuda: launch %s: %d parameters, at most %d", name, len(args), maxParams)
	}
	n := copy(b.argv[:], args)
	launch := launchArgs
	if pdl {
		launch = launchArgsPDL
	}
	if err := launch(f, grid, block, shared, &b.argv, n); err != nil {
		return fmt.Errorf("cuda: launch %s (grid %v, block %d, %d bytes of shared memory): %w", name, grid, block, shared, err)
	}
	return nil
}

func u(p cu.DevicePtr) uint64 { return uint64(p) }

// convert uploads a float32 host array into dst as dt.
func (b *Backend) convert(dst cu.DevicePtr, dt plan.DType, src []float32) error {
	const chunk = 1 << 24
	for off := 0; off < len(src); off += chunk {
		part := src[off:min(off+chunk, len(src))]
		p, err := upload(b, "stage", part)
		if err != nil {
			return err
		}
		d := dst + cu.DevicePtr(off*dt.Bytes())
		if err := b.launch(convertKernel[dt], [3]int{min((len(part)+255)/256, 4096), 1, 1}, 256, 0, u(p), u(d), uint64(len(part))); err != nil {
			return err
		}
	}
	return nil
}

// ---- layers ----

// NewLayer allocates a device pool of pages pages.
func (b *Backend) NewLayer(ctx context.Context, pages, kvHeads, headDim, pageSize int, dt plan.DType) (*DeviceLayer, error) {
	l := &DeviceLayer{Pages: pages, KVHeads: kvHeads, HeadDim: headDim, PageSize: pageSize, DType: dt}
	err := b.do(ctx, func() error {
		if err := b.allocLayer(l); err != nil {
			return err
		}
		return b.allocFP8(l)
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (b *Backend) allocLayer(l *DeviceLayer) error {
	kv := int64(l.kvPages()) * int64(l.KVHeads*l.PageSize*l.HeadDim*l.DType.Bytes())
	sum := int64(l.Pages) * int64(l.KVHeads*2*l.HeadDim*l.DType.Bytes())
	var err error
	if l.K, err = cu.MemAlloc(kv); err != nil {
		return fmt.Errorf("cuda: alloc K (%d bytes): %w", kv, err)
	}
	if l.V, err = cu.MemAlloc(kv); err != nil {
		cu.MemFree(l.K)
		return fmt.Errorf("cuda: alloc V (%d bytes): %w", kv, err)
	}
	if l.Summary, err = cu.MemAlloc(sum); err != nil {
		cu.MemFree(l.K)
		cu.MemFree(l.V)
		return fmt.Errorf("cuda: alloc summaries (%d bytes): %w", sum, err)
	}
	return nil
}

// NewPool implements kernels.DeviceStore: a DeviceLayer in the backend's
// storage type.
func (b *Backend) NewPool(ctx context.Context, pages, kvHeads, headDim, pageSize int) (any, error) {
	return b.NewLayer(ctx, pages, kvHeads, headDim, pageSize, b.cfg.DType)
}

// FreePool implements kernels.DeviceStore.
func (b *Backend) FreePool(ctx context.Context, pool any) error {
	l, ok := pool.(*DeviceLayer)
	if !ok {
		return fmt.Errorf("cuda: pool %T is not a *DeviceLayer", pool)
	}
	return b.FreeLayer(ctx, l)
}

func devicePool(pool any) (*DeviceLayer, error) {
	l, ok := pool.(*DeviceLayer)
	if !ok {
		return nil, fmt.Errorf("cuda: pool %T is not a *DeviceLayer", pool)
	}
	if l.K == 0 || l.V == 0 || l.Summary == 0 {
		return nil, errors.New("cuda: device pool is freed or was never allocated")
	}
	return l, nil
}

func (l *DeviceLayer) checkPages(pages ...int32) error {
	for _, p := range pages {
		if p < 0 || int(p) >= l.Pages {
			return fmt.Errorf("cuda: physical page %d outside pool of %d", p, l.Pages)
		}
	}
	return nil
}

// checkTokens checks a write of the tokens k, v ([n][KVHeads][HeadDim])
// from slot slot of pages pages on: whole tokens that fill exactly those
// pages. what names the call in the error.
func (l *DeviceLayer) checkTokens(what string, pages, slot int, k, v []float32) error {
	tok := l.KVHeads * l.HeadDim
	if len(k) == 0 || len(k)%tok != 0 || len(v) != len(k) {
		return fmt.Errorf("%s: k %d and v %d floats are not whole tokens of %d", what, len(k), len(v), tok)
	}
	n := len(k) / tok
	if slot < 0 || slot >= l.PageSize || (slot+n+l.PageSize-1)/l.PageSize != pages {
		return fmt.Errorf("%s: %d tokens from slot %d do not fill exactly %d pages of %d slots", what, n, slot, pages, l.PageSize)
	}
	return nil
}

// Byte sizes of one page of K (or V) and of summaries.
func (l *DeviceLayer) kvPageBytes() int64 {
	return int64(l.KVHeads*l.PageSize*l.HeadDim) * int64(l.DType.Bytes())
}
func (l *DeviceLayer) sumPageBytes() int64 {
	return int64(l.KVHeads*2*l.HeadDim) * int64(l.DType.Bytes())
}

// WriteTokens implements kernels.DeviceStore with one append kernel
// (stores the tokens converted to the pool's type and widens the pages'
// summaries with the stored keys). It is queued, not waited for.
func (b *Backend) WriteTokens(ctx context.Context, pool any, pages []int32, slot int, k, v []float32) error {
	l, err := devicePool(pool)
	if err != nil {
		return err
	}
	if err := l.checkTokens("cuda write tokens", len(pages), slot, k, v); err != nil {
		return err
	}
	if l.Slots > 0 {
		return errSlotPool
	}
	if err := l.checkPages(pages...); err != nil {
		return err
	}
	return b.do(ctx, func() error { return b.appendTokens(l, pages, slot, k, v) })
}

// appendTokens queues the append kernel: tokens at positions pos0.. of a
// sequence whose logical pages are pageTable (device goroutine only).
func (b *Backend) appendTokens(l *DeviceLayer, pageTable []int32, pos0 int, k, v []float32) error {
	n := len(k) / (l.KVHeads * l.HeadDim)
	pt, err := upload(b, "append.pt", pageTable)
	if err != nil {
		return err
	}
	kp, err := upload(b, "append.k", k)
	if err != nil {
		return err
	}
	vp, err := upload(b, "append.v", v)
	if err != nil {
		return err
	}
	touched := (pos0+n-1)/l.PageSize - pos0/l.PageSize + 1
	if err := b.launch("quest_append_"+l.DType.String(), [3]int{touched, l.KVHeads, 1}, min(l.HeadDim, 256), 0,
		u(l.K), u(l.V), u(l.Summary), u(pt), u(kp), u(vp), uint64(pos0), uint64(n), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.PageSize)); err != nil {
		return err
	}
	return b.encodeFP8(l, pt, int64(pos0/l.PageSize), touched) // the touched pages' fp8 records, if kept
}

// Rescan implements kernels.DeviceStore with one kernel over the pages. It
// is queued, not waited for.
func (b *Backend) Rescan(ctx context.Context, pool any, pages []int32, valid int) error {
	l, err := devicePool(pool)
	if err != nil {
		return err
	}
	if valid < 0 || valid > l.PageSize {
		return fmt.Errorf("cuda rescan: %d valid slots outside 0..%d", valid, l.PageSize)
	}
	if l.Slots > 0 && valid > 0 {
		return errSlotPool // valid 0 empties summaries, which a slot pool indexes by page
	}
	if err := l.checkPages(pages...); err != nil {
		return err
	}
	if len(pages) == 0 {
		return nil
	}
	return b.do(ctx, func() error {
		list, err := upload(b, "rescan.pages", pages)
		if err != nil {
			return err
		}
		if err := b.launch("quest_rescan_"+l.DType.String(), [3]int{len(pages), l.KVHeads, 1}, min(l.HeadDim, 256), 0,
			u(l.K), u(l.Summary), u(list), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.PageSize), uint64(valid)); err != nil {
			return err
		}
		return b.encodeFP8(l, list, 0, len(pages))
	})
}

// CopyPage implements kernels.DeviceStore: three device-to-device copies,
// queued, not waited for.
func (b *Backend) CopyPage(ctx context.Context, pool any, dst, src int32) error {
	l, err := devicePool(pool)
	if err != nil {
		return err
	}
	if err := l.checkPages(dst, src); err != nil {
		return err
	}
	if l.Slots > 0 {
		return errSlotPool
	}
	return b.do(ctx, func() error {
		kv, sum := l.kvPageBytes(), l.sumPageBytes()
		for _, c := range []struct {
			base cu.DevicePtr
			size int64
		}{{l.K, kv}, {l.V, kv}, {l.Summary, sum}} {
			d, s := c.base+cu.DevicePtr(int64(dst)*c.size), c.base+cu.DevicePtr(int64(src)*c.size)
			if err := cu.MemcpyDtoDAsync(d, s, c.size, cu.Stream{}); err != nil {
				return fmt.Errorf("cuda: copy page %d to %d: %w", src, dst, err)
			}
		}
		return b.copyFP8(l, dst, src)
	})
}

// deviceTables is a set of device page tables (kernels.DeviceStore), owned
// by the device goroutine.
type deviceTables struct {
	m       map[uint64]*devTable
	maxPage int // largest pool size the entries were checked against
	freed   bool
}

// devTable is one sequence's page table: n entries of int32 in a device
// allocation of cap entries (grown by doubling).
type devTable struct {
	ptr    cu.DevicePtr
	n, cap int
}

func tableSet(set any) (*deviceTables, error) {
	ts, ok := set.(*deviceTables)
	if !ok {
		return nil, fmt.Errorf("cuda: table set %T is not a *deviceTables", set)
	}
	return ts, nil
}

// NewTables implements kernels.DeviceStore.
func (b *Backend) NewTables(ctx context.Context) (any, error) {
	return &deviceTables{m: map[uint64]*devTable{}}, nil
}

// FreeTables implements kernels.DeviceStore.
func (b *Backend) FreeTables(ctx context.Context, set any) error {
	ts, err := tableSet(set)
	if err != nil {
		return err
	}
	return b.do(ctx, func() error {
		for _, t := range ts.m {
			cu.MemFree(t.ptr)
		}
		ts.m, ts.freed = nil, true
		return nil
	})
}

// WriteTable implements kernels.DeviceStore: the entries go up through the
// staging buffer, queued; a table that outgrows its allocation moves to
// one twice as large.
func (b *Backend) WriteTable(ctx context.Context, set any, seq uint64, at int, pages []int32, n, maxPage int) error {
	ts, err := tableSet(set)
	if err != nil {
		return err
	}
	if at < 0 || n < at+len(pages) {
		return fmt.Errorf("cuda write table: entries [%d,%d) beyond the length %d", at, at+len(pages), n)
	}
	for _, p := range pages {
		if p < 0 || int(p) >= maxPage {
			return fmt.Errorf("cuda write table: physical page %d outside pool of %d", p, maxPage)
		}
	}
	return b.do(ctx, func() error {
		if ts.freed {
			return errors.New("cuda write table: the table set is freed")
		}
		t := ts.m[seq]
		if t == nil {
			t = &devTable{}
			ts.m[seq] = t
		}
		if at > t.n || n > max(t.n, at+len(pages)) {
			return fmt.Errorf("cuda write table: sequence %d: %d entries from %d, length %d, would leave entries unwritten (table of %d)", seq, len(pages), at, n, t.n)
		}
		ts.maxPage = max(ts.maxPage, maxPage)
		if n > t.cap {
			size := max(n, 2*t.cap, 64)
			p, err := cu.MemAlloc(int64(size) * 4)
			if err != nil {
				return fmt.Errorf("cuda: page table of %d entries: %w", size, err)
			}
			if keep := min(t.n, n); keep > 0 {
				if err := cu.MemcpyDtoDAsync(p, t.ptr, int64(keep)*4, cu.Stream{}); err != nil {
					cu.MemFree(p)
					return fmt.Errorf("cuda: move page table: %w", err)
				}
			}
			if t.ptr != 0 {
				cu.MemFree(t.ptr) // waits for the kernels that read it
			}
			t.ptr, t.cap = p, size
		}
		if len(pages) > 0 {
			src, err := b.stage(int64(len(pages)) * 4)
			if err != nil {
				return err
			}
			copy(unsafe.Slice((*int32)(src), len(pages)), pages)
			if err := cu.MemcpyHtoDAsync(t.ptr+cu.DevicePtr(at*4), src, int64(len(pages))*4, cu.Stream{}); err != nil {
				return fmt.Errorf("cuda: write page table: %w", err)
			}
			b.staged = true
		}
		t.n = n // only once the entries are on their way
		return nil
	})
}

// DropTable implements kernels.DeviceStore.
func (b *Backend) DropTable(ctx context.Context, set any, seq uint64) error {
	ts, err := tableSet(set)
	if err != nil {
		return err
	}
	return b.do(ctx, func() error {
		if t := ts.m[seq]; t != nil {
			cu.MemFree(t.ptr)
			delete(ts.m, seq)
		}
		return nil
	})
}

// tablePtrs fills b.tabs with the device addresses of the batch's page
// tables, checking that each holds the pages the batch reads and that the
// set's entries fit a pool of pool pages (device goroutine only).
func (b *Backend) tablePtrs(bt *kernels.Batch, pool int) error {
	ts, err := tableSet(bt.Tables.Set)
	if err != nil {
		return err
	}
	if ts.freed {
		return errors.New("cuda: the batch's table set is freed")
	}
	if ts.maxPage > pool {
		return fmt.Errorf("cuda: the batch's page tables index pools of %d pages, this pool has %d", ts.maxPage, pool)
	}
	b.tabs = b.tabs[:0]
	for i, id := range bt.Tables.Seqs {
		t := ts.m[id]
		if np := bt.NumPages(i); np > 0 && t == nil {
			return fmt.Errorf("cuda: sequence %d has no device page table", id)
		} else if np > 0 && t.n < np {
			return fmt.Errorf("cuda: sequence %d: device page table of %d entries, the batch reads %d pages", id, t.n, np)
		}
		var p cu.DevicePtr
		if t != nil {
			p = t.ptr
		}
		b.tabs = append(b.tabs, int32(uint64(p)), int32(uint64(p)>>32))
	}
	return nil
}

// gatherPages launches the kernel that builds the batch's page list on
// the device from its tables (addresses at tabs, indptr at ind) and
// returns the list.
func (b *Backend) gatherPages(bt *kernels.Batch, tabs, ind cu.DevicePtr) (cu.DevicePtr, error) {
	out, err := b.buf("batch.pages", int64(bt.Total())*4)
	if err != nil {
		return 0, err
	}
	blocks := min((bt.MaxPages()+255)/256, 64)
	return out, b.launch("quest_gather_tables", [3]int{blocks, bt.Len(), 1}, 256, 0, u(tabs), u(ind), u(out))
}

// ReadPages implements kernels.DeviceStore: it waits for the queued work,
// copies each run of consecutive pages back and converts it to float32.
func (b *Backend) ReadPages(ctx context.Context, pool any, pages []int32) (kernels.Layer, error) {
	l, err := devicePool(pool)
	if err != nil {
		return kernels.Layer{}, err
	}
	if err := l.checkPages(pages...); err != nil {
		return kernels.Layer{}, err
	}
	kvN, sumN := l.KVHeads*l.PageSize*l.HeadDim, l.KVHeads*2*l.HeadDim
	out := kernels.Layer{K: make([]float32, 0, len(pages)*kvN), V: make([]float32, 0, len(pages)*kvN), Summary: make([]float32, 0, len(pages)*sumN)}
	err = b.do(ctx, func() error {
		for i := 0; i < len(pages); {
			j := i + 1
			for j < len(pages) && pages[j] == pages[j-1]+1 {
				j++
			}
			first, n := int64(pages[i]), j-i
			for _, c := range []struct {
				dst  *[]float32
				base cu.DevicePtr
				per  int
			}{{&out.K, l.K, kvN}, {&out.V, l.V, kvN}, {&out.Summary, l.Summary, sumN}} {
				if l.Slots > 0 && c.dst != &out.Summary {
					continue // a slot pool's K/V are addressed by slot (ReadSlotKV)
				}
				x, err := readAs(b, c.base+cu.DevicePtr(first*int64(c.per*l.DType.Bytes())), n*c.per, l.DType)
				if err != nil {
					return fmt.Errorf("cuda: read pages: %w", err)
				}
				*c.dst = append(*c.dst, x...)
			}
			i = j
		}
		return nil
	})
	if err != nil {
		return kernels.Layer{}, err
	}
	return out, nil
}

// FreeLayer releases a layer's device memory.
func (b *Backend) FreeLayer(ctx context.Context, l *DeviceLayer) error {
	return b.do(ctx, func() error {
		for _, p := range []cu.DevicePtr{l.K, l.V, l.Summary} {
			if p != 0 {
				cu.MemFree(p)
			}
		}
		freeFP8(l)
		l.K, l.V, l.Summary, l.Pages = 0, 0, 0, 0
		return nil
	})
}

// Upload copies a host pool (float32, the CPU layout) into l, converting
// to l.DType. Nil host arrays are skipped.
func (b *Backend) Upload(ctx context.Context, l *DeviceLayer, h kernels.Layer) error {
	kv, sum := l.Pages*l.KVHeads*l.PageSize*l.HeadDim, l.Pages*l.KVHeads*2*l.HeadDim
	if (h.K != nil && len(h.K) != kv) || (h.V != nil && len(h.V) != kv) || (h.Summary != nil && len(h.Summary) != sum) {
		return fmt.Errorf("cuda upload: host arrays K=%d V=%d summary=%d floats, the layer holds %d and %d", len(h.K), len(h.V), len(h.Summary), kv, sum)
	}
	return b.do(ctx, func() error {
		if err := b.upload(l, h); err != nil {
			return err
		}
		return cu.Synchronize()
	})
}

func (b *Backend) upload(l *DeviceLayer, h kernels.Layer) error {
	for _, x := range []struct {
		dst cu.DevicePtr
		src []float32
	}{{l.K, h.K}, {l.V, h.V}, {l.Summary, h.Summary}} {
		if x.src != nil {
			if err := b.convert(x.dst, l.DType, x.src); err != nil {
				return err
			}
		}
	}
	if h.Summary != nil {
		return b.encodeFP8(l, 0, 0, len(h.Summary)/(l.KVHeads*2*l.HeadDim))
	}
	return nil
}

// Append writes n tokens (k, v: float32 [n][KVHeads][D]) of one sequence at
// positions pos0.. into l through pageTable (logical -> physical) and
// widens the touched pages' summaries on the device (the first token of a
// page resets its summary).
func (b *Backend) Append(ctx context.Context, l *DeviceLayer, pageTable []int32, pos0 int, k, v []float32) error {
	tok := l.KVHeads * l.HeadDim
	if len(k) == 0 || len(k)%tok != 0 || len(v) != len(k) {
		return fmt.Errorf("cuda append: k %d and v %d floats are not whole tokens of %d", len(k), len(v), tok)
	}
	n := len(k) / tok
	if pos0 < 0 {
		return fmt.Errorf("cuda append: position %d < 0", pos0)
	}
	if (pos0+n+l.PageSize-1)/l.PageSize > len(pageTable) {
		return fmt.Errorf("cuda append: %d pages needed, page table has %d", (pos0+n+l.PageSize-1)/l.PageSize, len(pageTable))
	}
	for _, p := range pageTable {
		if p < 0 || int(p) >= l.Pages {
			return fmt.Errorf("cuda append: physical page %d outside pool of %d", p, l.Pages)
		}
	}
	return b.do(ctx, func() error {
		if err := b.appendTokens(l, pageTable, pos0, k, v); err != nil {
			return err
		}
		return cu.Synchronize()
	})
}

// Read copies a device layer back to float32 host arrays (tests).
func (b *Backend) Read(ctx context.Context, l *DeviceLayer) (kernels.Layer, error) {
	var h kernels.Layer
	err := b.do(ctx, func() error {
		var err error
		if h.K, err = readAs(b, l.K, l.Pages*l.KVHeads*l.PageSize*l.HeadDim, l.DType); err != nil {
			return err
		}
		if h.V, err = readAs(b, l.V, l.Pages*l.KVHeads*l.PageSize*l.HeadDim, l.DType); err != nil {
			return err
		}
		h.Summary, err = readAs(b, l.Summary, l.Pages*l.KVHeads*2*l.HeadDim, l.DType)
		return err
	})
	return h, err
}

func readAs(b *Backend, p cu.DevicePtr, n int, dt plan.DType) ([]float32, error) {
	out := make([]float32, n)
	if n == 0 {
		return out, nil
	}
	if dt == plan.Float32 {
		return out, download(b, out, p)
	}
	raw := make([]uint16, n)
	if err := cu.MemcpyDtoH(unsafe.Pointer(&raw[0]), p, int64(n)*2); err != nil {
		return nil, err
	}
	for i, x := range raw {
		if dt == plan.BFloat16 {
			out[i] = math.Float32frombits(uint32(x) << 16)
		} else {
			out[i] = kernels.HalfToFloat32(x)
		}
	}
	return out, nil
}

// layer resolves the kernels.Layer of a call: its DeviceLayer, or the host
// arrays uploaded into the scratch layer (summaries only when withKV is
// false).
func (b *Backend) layer(s kernels.Shape, l kernels.Layer, withKV bool) (*DeviceLayer, error) {
	if dl, ok := l.Device.(*DeviceLayer); ok {
		if dl.K == 0 || dl.V == 0 || dl.Summary == 0 {
			return nil, errors.New("cuda: device layer is freed or was never allocated")
		}
		if dl.KVHeads != s.KVHeads || dl.HeadDim != s.HeadDim || dl.PageSize != s.PageSize {
			return nil, fmt.Errorf("cuda: device layer %dx%dx%d does not match shape %+v", dl.KVHeads, dl.PageSize, dl.HeadDim, s)
		}
		return dl, nil
	}
	rec := s.KVHeads * 2 * s.HeadDim
	pages := len(l.Summary) / rec
	if len(l.Summary) != pages*rec || (withKV && (len(l.K) != pages*s.KVHeads*s.PageSize*s.HeadDim || len(l.V) != len(l.K))) {
		return nil, fmt.Errorf("cuda: host pool K=%d V=%d summary=%d floats is not a whole number of pages", len(l.K), len(l.V), len(l.Summary))
	}
	if b.host == nil || b.host.Pages < pages || b.host.KVHeads != s.KVHeads || b.host.HeadDim != s.HeadDim || b.host.PageSize != s.PageSize {
		if b.host != nil {
			for _, p := range []cu.DevicePtr{b.host.K, b.host.V, b.host.Summary} {
				cu.MemFree(p)
			}
			freeFP8(b.host)
			b.host = nil
		}
		h := &DeviceLayer{Pages: max(pages, 1), KVHeads: s.KVHeads, HeadDim: s.HeadDim, PageSize: s.PageSize, DType: b.cfg.DType}
		if err := b.allocLayer(h); err != nil {
			return nil, err
		}
		if err := b.allocFP8(h); err != nil {
			return nil, err
		}
		b.host = h
	}
	up := kernels.Layer{Summary: l.Summary}
	if withKV {
		up.K, up.V = l.K, l.V
	}
	return b.host, b.upload(b.host, up)
}

// Number of multiprocessors the work-size heuristics aim to fill (H200:
// 132); a guess is fine, it only sizes work items.
const targetSMs = 132

// attendChunk picks the pages per item of the CUDA-core attention kernels:
// cfg when set, else enough items to fill the GPU several times over, 2 to
// 64 pages each.
func attendChunk(cfg, listed int) int {
	if cfg > 0 {
		return min(cfg, 64) // the pipelined kernel stages at most 64 page ids
	}
	return min(64, max(2, (listed+8*targetSMs-1)/(8*targetSMs)))
}

// attendChunkMMA is attendChunk for the tensor-core kernel, which has no
// limit on the pages of an item: about two items per SM (it fits two
// blocks per SM, so all items run in one wave with their pages in flight
// together), 4 to 2048 pages each (at least one page per warp), so that
// long rows keep few items (and their merge fused, see fuseMaxItems).
func attendChunkMMA(cfg, listed int) int {
	if cfg > 0 {
		return cfg
	}
	return min(2048, max(4, (listed+2*targetSMs-1)/(2*targetSMs)))
}

// chunkFor picks attendChunk or attendChunkMMA for the kernel that will
// run.
func (b *Backend) chunkFor(s kernels.Shape, dt plan.DType, listed int) int {
	if useMMA(s, dt) {
		return attendChunkMMA(b.cfg.AttendChunk, listed)
	}
	return attendChunk(b.cfg.AttendChunk, listed)
}

// Two-stage top-K limits (quest.cu): a slice of a row and the candidates of
// a row must fit shared memory.
const (
	topkSliceMax = 8192
	topkCandMax  = 4096
)

// topkSlices picks the slice length for the two-stage top-K of rows of up
// to maxN candidates keeping up to maxK, or 0 when the single-block kernel
// must run (short rows, large k, rows with k >= n or k <= 0).
func topkSlices(plan *kernels.TopKPlan) (slice, slices, kmax int) {
	maxN := 0
	for r := range plan.Rows() {
		n, k := int(plan.N[r]), int(plan.K[r])
		if k <= 0 || k >= n {
			return 0, 0, 0
		}
		maxN, kmax = max(maxN, n), max(kmax, k)
	}
	if maxN < 4*topkSliceMax/2 || 2*kmax > topkCandMax {
		return 0, 0, 0 // one block per row is as fast for short rows
	}
	slices = min(topkCandMax/kmax, (maxN+topkSliceMax/4-1)/(topkSliceMax/4))
	slice = (maxN + slices - 1) / slices
	if slice > topkSliceMax || slice <= kmax {
		return 0, 0, 0
	}
	slices = (maxN + slice - 1) / slice
	if plan.Rows()*slices > 2*targetSMs {
		// Enough rows to fill the GPU one block each (measured on an
		// H200: 64 rows of 65536 run faster in one stage).
		return 0, 0, 0
	}
	return slice, slices, kmax
}

// Threshold top-K limits (quest.cu, quest_topk_thr): rows of at most
// topkThrMaxN scores keeping at most topkThrMaxK.
const (
	topkThrMaxN = 8192 * 8
	topkThrMaxK = 4096 / 8
)

// topkThr reports whether every row suits quest_topk_thr.
func topkThr(plan *kernels.TopKPlan) bool {
	for r := range plan.Rows() {
		if plan.N[r] > topkThrMaxN || plan.K[r] > topkThrMaxK {
			return false
		}
	}
	return true
}

// Multi-block radix top-K limits (quest.cu, quest_topk_radix).
const (
	topkRadixThreads = 1024 // RADIX_THREADS
	topkRadixMaxK    = 4096 // RADIX_KMAX: the largest k of a row with k < n
	topkRadixSCap    = 3072 // RADIX_SCAP
	topkRadixCtrl    = 32   // RADIX_CTRL: control ints per row
	topkRadixBins    = 4096 // RADIX_BINS
	// topkRadixTile is the fewest scores per block and pass worth a
	// block of their own.
	topkRadixTile = 16384
	// topkRadixMinN: a plan that neither the threshold nor the two-stage
	// top-K takes runs the multi-block radix select when its longest row
	// (with 0 < k < n) has at least this many scores, else one block per
	// row (quest_topk). A guess, not a measurement: tune it with
	// BenchmarkTopKLong (the radix select costs a fixed few microseconds
	// of launch, memset and pass hand-overs; one block per row scales
	// with the row).
	topkRadixMinN = 32768
	// topkRadixBufBytes bounds the candidate buffers of all rows.
	topkRadixBufBytes = 64 << 20
)

// topkRadix reports whether plan suits the multi-block radix select: a row
// with 0 < k < n of at least topkRadixMinN scores, and every such row
// keeping at most topkRadixMaxK.
func topkRadix(plan *kernels.TopKPlan) bool {
	maxN := 0
	for r := range plan.Rows() {
		n, k := int(plan.N[r]), int(plan.K[r])
		if k <= 0 || k >= n {
			continue
		}
		if k > topkRadixMaxK {
			return false
		}
		maxN = max(maxN, n)
	}
	return maxN >= topkRadixMinN
}

// launchTopKRadix runs quest_topk_radix over every row of plan (any n and
// k; rows with 0 < k < n must keep at most topkRadixMaxK): a memset of the
// control words and one launch, no host synchronization.
func (b *Backend) launchTopKRadix(plan *kernels.TopKPlan, scores cu.DevicePtr, ptrs [5]cu.DevicePtr, out cu.DevicePtr) error {
	rows := plan.Rows()
	maxN := 1
	for r := range rows {
		maxN = max(maxN, int(plan.N[r]))
	}
	ib := max(1, bits.Len(uint(maxN-1)))
	npass := (32+ib+11)/12 + 1 // 12-bit digits of the (key, index) composite, then a gathering pass
	g := max(1, min(targetSMs/rows, (maxN+topkRadixTile-1)/topkRadixTile))
	bufcap := min(1<<16, maxN, topkRadixBufBytes/(16*rows))
	bufcap = max(bufcap, topkRadixSCap)
	ctrlWords := int64(64 + rows*topkRadixCtrl)
	ctrl, err := b.buf("topk.radix.ctrl", ctrlWords*4)
	if err != nil {
		return err
	}
	if err := cu.MemsetD32Async(ctrl, 0, ctrlWords, cu.Stream{}); err != nil {
		return fmt.Errorf("cuda: zero top-K control words: %w", err)
	}
	// The histograms are zero between launches (each pass clears what it
	// used); a new buffer starts zeroed.
	old := b.bufs["topk.radix.hist"]
	hist, err := b.buf("topk.radix.hist", int64(rows*topkRadixBins)*4)
	if err != nil {
		return err
	}
	if nb := b.bufs["topk.radix.hist"]; nb != old {
		if err := cu.MemsetD32Async(hist, 0, nb.size/4, cu.Stream{}); err != nil {
			return fmt.Errorf("cuda: zero top-K histograms: %w", err)
		}
	}
	kept, err := b.buf("topk.radix.kept", int64(rows*topkRadixMaxK)*4)
	if err != nil {
		return err
	}
	cand, err := b.buf("topk.radix.cand", int64(rows)*2*int64(bufcap)*8)
	if err != nil {
		return err
	}
	grid := npass*rows*g + rows
	return b.launch("quest_topk_radix", [3]int{grid, 1, 1}, topkRadixThreads, 0, u(scores), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out),
		u(ctrl), u(hist), u(kept), u(cand), uint64(rows), uint64(g), uint64(ib), uint64(npass), uint64(bufcap))
}

// Sample-then-one-pass top-K limits (quest.cu, quest_topk_sample_t*).
const (
	topkSampleSCap  = 3072  // SAMP_SCAP
	topkSampleSMax  = 10240 // SAMP_SMAX: the most sampled scores per row
	topkSampleStats = 8     // SAMP_STATS: statistics ints before the rows'
	topkSampleRow   = 2     // SAMP_ROW: control ints per row
	// Flags (SAMP_F_*), for tests.
	topkSampleFallback = 1 // every row takes the one-block fallback
	topkSampleNoSmem   = 2 // narrow the candidates in global memory
	topkSampleDirect   = 4 // append candidates to global memory as found (no staging)
)

// topkVariant is one configuration of the multi-block top-K for long
// rows: v0 is quest_topk_radix (kernel == ""); the others run kernel,
// quest_topk_sample_t<threads>, with about perSM blocks per multiprocessor
// (rows x G blocks, G = perSM*targetSMs/rows, at least tile scores per
// block), a sample of at most mmax scores per row and flags.
type topkVariant struct {
	name    string
	kernel  string
	threads int
	perSM   int
	tile    int
	mmax    int
	flags   int
}

// topkRadixVariants are timed side by side by BenchmarkTopKLong and
// checked by TestTopKLongVariants; launchTopK runs
// topkRadixVariants[topkRadixDefault].
var topkRadixVariants = []topkVariant{
	{name: "v0"},
	{name: "v1", kernel: "quest_topk_sample_t1024", threads: 1024, perSM: 1, tile: 16384, mmax: topkSampleSMax},
	{name: "v2", kernel: "quest_topk_sample_t512", threads: 512, perSM: 2, tile: 16384, mmax: topkSampleSMax},
	{name: "v3", kernel: "quest_topk_sample_t512", threads: 512, perSM: 4, tile: 8192, mmax: topkSampleSMax},
	{name: "v4", kernel: "quest_topk_sample_t256", threads: 256, perSM: 4, tile: 8192, mmax: topkSampleSMax},
	{name: "v5", kernel: "quest_topk_sample_t512", threads: 512, perSM: 2, tile: 16384, mmax: topkSampleSMax / 2},
	{name: "v6", kernel: "quest_topk_sample_t512", threads: 512, perSM: 2, tile: 16384, mmax: topkSampleSMax, flags: topkSampleDirect},
}

// topkRadixDefault indexes the variant launchTopK runs for long rows: v1,
// the fastest on the H200 (BenchmarkTopKLong, 8 rows, k 256: 59 us at
// 655,360 pages and 101 us at 4,194,304, against v0's 69 and 228;
// bench/results/2026-12-01-topk-long-h200.md).
const topkRadixDefault = 1

func topkVariantByName(name string) (topkVariant, bool) {
	for _, v := range topkRadixVariants {
		if v.name == name {
			return v, true
		}
	}
	return topkVariant{}, false
}

// launchTopKVariant runs plan (as launchTopKRadix takes it) through
// variant v: v0 is launchTopKRadix; the others are one launch of
// v.kernel, no memset (the kernel leaves its control words zero) and no
// host synchronization.
func (b *Backend) launchTopKVariant(plan *kernels.TopKPlan, scores cu.DevicePtr, ptrs [5]cu.DevicePtr, out cu.DevicePtr, v topkVariant) error {
	if v.kernel == "" {
		return b.launchTopKRadix(plan, scores, ptrs, out)
	}
	rows := plan.Rows()
	maxN := 1
	for r := range rows {
		maxN = max(maxN, int(plan.N[r]))
	}
	g := max(1, min(v.perSM*targetSMs/rows, (maxN+v.tile-1)/v.tile))
	bufcap := max(topkSampleSCap, min(maxN, topkRadixBufBytes/(8*rows)))
	ctrl, err := b.topkSampleCtrl(rows)
	if err != nil {
		return err
	}
	cand, err := b.buf("topk.sample.cand", int64(rows)*int64(bufcap)*8)
	if err != nil {
		return err
	}
	return b.launch(v.kernel, [3]int{rows * g, 1, 1}, v.threads, 0,
		u(scores), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out),
		u(ctrl), u(cand), uint64(g), uint64(bufcap), uint64(v.mmax), uint64(v.flags))
}

// topkSampleCtrl returns the sample top-K's control words for rows rows:
// zero when new (every launch leaves the rows' words zero).
func (b *Backend) topkSampleCtrl(rows int) (cu.DevicePtr, error) {
	old := b.bufs["topk.sample.ctrl"]
	ctrl, err := b.buf("topk.sample.ctrl", int64(topkSampleStats+rows*topkSampleRow)*4)
	if err != nil {
		return 0, err
	}
	if nb := b.bufs["topk.sample.ctrl"]; nb != old {
		if err := cu.MemsetD32Async(ctrl, 0, nb.size/4, cu.Stream{}); err != nil {
			return 0, fmt.Errorf("cuda: zero top-K control words: %w", err)
		}
	}
	return ctrl, nil
}

// launchTopK runs the threshold top-K (one block per row) when every row
// suits it, else the two-stage top-K when the rows suit that, else the
// multi-block radix select for long rows (topkRadix), else the radix
// select with one block per row. ptrs are the plan's ScoreOff, N, Base, K,
// OutOff on the device.
//
// tmax, when not 0, holds tile maxima from the score kernel and every row
// of the plan starts at a score row's start. pdl launches the threshold
// kernel as a programmatic dependent of the score kernel.
func (b *Backend) launchTopK(plan *kernels.TopKPlan, scores, tmax cu.DevicePtr, ptrs [5]cu.DevicePtr, out cu.DevicePtr, pdl bool) error {
	rows := plan.Rows()
	if topkThr(plan) {
		return b.launchMode(pdl, "quest_topk_thr", [3]int{rows, 1, 1}, 1024, 0, u(scores), u(tmax), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out))
	}
	slice, slices, kmax := topkSlices(plan)
	if slices == 0 && topkRadix(plan) {
		return b.launchTopKVariant(plan, scores, ptrs, out, topkRadixVariants[topkRadixDefault])
	}
	if slices == 0 {
		return b.launch("quest_topk", [3]int{rows, 1, 1}, 1024, 0, u(scores), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out))
	}
	ck, err := b.buf("topk.ckey", int64(rows*slices*kmax)*4)
	if err != nil {
		return err
	}
	ci, err := b.buf("topk.cidx", int64(rows*slices*kmax)*4)
	if err != nil {
		return err
	}
	if err := b.launch("quest_topk_local", [3]int{slices, rows, 1}, 1024, 0, u(scores), u(ptrs[0]), u(ptrs[1]), u(ptrs[3]), u(ck), u(ci),
		uint64(slice), uint64(slices), uint64(kmax)); err != nil {
		return err
	}
	return b.launch("quest_topk_merge", [3]int{rows, 1, 1}, 1024, 0, u(ck), u(ci), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out),
		uint64(slices), uint64(kmax))
}

// Shared memory: a launch gets at most 48 KiB without an opt-in attribute,
// which gorgonia.org/cu cannot set; the staged kernels also use 768 bytes of
// static shared memory.
const (
	maxSmem          = 48 << 10
	attendStaticSmem = 768
)

// reduceThreads is the block size of quest_reduce: whole warps, at least
// D/2 threads (each thread owns two dims at most).
func reduceThreads(d int) int { return max(32, min(128, (d+31)/32*32)) }

// launchScore runs the score kernel: the D=128 fast path (G in 1, 2, 4, 8)
// or the generic one.
//
// tmax, when not 0, asks for the maximum of every tile of 8 pages of each
// output row as well (laid out like the scores, see quest_topk_thr); only
// the tensor-core kernel writes them, and wrote reports whether it did.
func (b *Backend) launchScore(dl *DeviceLayer, s kernels.Shape, n, maxPages int, ind, pg, qp, op, tmax cu.DevicePtr, perHead uint64) (wrote bool, err error) {
	if dl.FP8 != nil {
		return b.launchScoreFP8(dl, s.QHeads, n, maxPages, ind, pg, qp, op, tmax, perHead)
	}
	g := s.Group()
	if useMMA(s, dl.DType) {
		chunk := b.mmaScoreChunk(n, s.KVHeads, maxPages)
		name, err := b.mmaScoreName(s, dl.DType)
		if err != nil {
			return false, err
		}
		grid := [3]int{s.KVHeads, (maxPages + chunk - 1) / chunk, n} // heads first (mma.cu)
		return tmax != 0, b.launch(name, grid, 128, 0,
			u(dl.Summary), u(ind), u(pg), u(qp), u(op), u(tmax), uint64(s.QHeads), uint64(s.KVHeads), perHead, uint64(chunk))
	}
	if s.HeadDim == 128 && (g == 1 || g == 2 || g == 4 || g == 8) {
		chunk := b.cfg.ScoreChunk
		if chunk <= 0 {
			chunk = min(1024, max(16, (n*s.KVHeads*maxPages+8*targetSMs-1)/(8*targetSMs)))
		}
		name := fmt.Sprintf("quest_score128_%s_g%d", dl.DType, g)
		if g == 4 && dl.DType != plan.Float32 {
			name = "quest_score128g4_" + dl.DType.String()
		}
		return false, b.launch(name, [3]int{(maxPages + chunk - 1) / chunk, s.KVHeads, n}, 128, 0,
			u(dl.Summary), u(ind), u(pg), u(qp), u(op), uint64(s.QHeads), uint64(s.KVHeads), perHead, uint64(chunk))
	}
	if s.QHeads*2*s.HeadDim*4 > maxSmem {
		return false, fmt.Errorf("cuda: %d query heads x D %d exceed the generic scoring kernel's shared memory (the D = 128 kernels take G in 1, 2, 4, 8)", s.QHeads, s.HeadDim)
	}
	chunk := b.cfg.ScoreChunk
	if chunk <= 0 {
		chunk = 64
	}
	return false, b.launch("quest_score_"+dl.DType.String(), [3]int{(maxPages + chunk - 1) / chunk, n, 1}, 256, s.QHeads*2*s.HeadDim*4,
		u(dl.Summary), u(ind), u(pg), u(qp), u(op), uint64(s.QHeads), uint64(s.KVHeads), uint64(s.HeadDim), perHead, uint64(chunk))
}

// mmaScoreChunk is the pages per block of the tensor-core score kernels
// (16-bit and fp8 records): Config.ScoreChunk, else about 8 blocks per SM
// with 32 to 1024 pages each (measured on an H200: better balanced than
// one wave of 4 per SM); never more chunks than gridDim.y takes, and a
// multiple of 8 (blocks start on tile boundaries).
func (b *Backend) mmaScoreChunk(n, kvHeads, maxPages int) int {
	chunk := b.cfg.ScoreChunk
	if chunk <= 0 {
		chunk = min(1024, max(32, (n*kvHeads*maxPages+8*targetSMs-1)/(8*targetSMs)))
	}
	chunk = max(chunk, (maxPages+65534)/65535) // chunks go in gridDim.y (at most 65535)
	return (chunk + 7) / 8 * 8
}

// scoreWritesTiles reports whether launchScore's kernel for dl writes tile
// maxima when asked (the tensor-core kernels).
func (b *Backend) scoreWritesTiles(s kernels.Shape, dl *DeviceLayer) bool {
	if dl.FP8 != nil {
		return b.fp8MMA(s.QHeads, dl)
	}
	return useMMA(s, dl.DType)
}

// attendArgs are the device arrays of one attention call: the batch's CSR
// (indptr, pages, last lengths), the queries, the work items (sequence, row,
// list range), the lists, each row's item range, and the outputs.
type attendArgs struct {
	ind, pg, last, q               cu.DevicePtr
	iSeq, iRow, iLo, iHi, lists    cu.DevicePtr
	rowItem, o, lse                cu.DevicePtr
	items, nrows                   int
	minItemsPerRow, maxItemsPerRow int
}

// fuseMaxItems is the most items per row for which the tensor-core
// attention kernel merges the row itself (its last block reads every
// partial state of the row; longer rows go to quest_reduce, one block per
// row and head). A row without items (an empty list) also needs
// quest_reduce, which writes its empty state.
const fuseMaxItems = 64

// launchAttendReduce runs the attention kernel and merges the partial
// states into a.o / a.lse: the tensor-core kernel (with the merge fused
// when rows are short), else the pipelined or generic kernel followed by
// quest_reduce.
//
// pdl launches the tensor-core kernel as a programmatic dependent of the
// previous kernel (the top-K that writes the lists).
func (b *Backend) launchAttendReduce(dl *DeviceLayer, s kernels.Shape, heads int, perHead uint64, a attendArgs, pdl bool) error {
	d := s.HeadDim
	rows := a.nrows // rows of the whole batch
	po, err := b.buf("attend.po", int64(a.items*heads*d)*4)
	if err != nil {
		return err
	}
	pl, err := b.buf("attend.pl", int64(a.items*heads)*4)
	if err != nil {
		return err
	}
	reduce := func() error {
		rowsPerSeq := s.KVHeads
		if perHead == 1 {
			rowsPerSeq = s.QHeads
		}
		return b.launch("quest_reduce", [3]int{rows * heads, 1, 1}, reduceThreads(d), 0,
			u(po), u(pl), u(a.rowItem), u(a.o), u(a.lse), uint64(rows), uint64(rowsPerSeq), uint64(s.QHeads), uint64(s.KVHeads), uint64(d), perHead)
	}
	if useMMA(s, dl.DType) {
		name, err := b.mmaAttendName(s, dl.DType, heads)
		if err != nil {
			return err
		}
		smem, ok := b.smem[name]
		if !ok {
			return fmt.Errorf("cuda: no tensor-core attention kernel %s", name)
		}
		fuse := a.minItemsPerRow >= 1 && a.maxItemsPerRow <= fuseMaxItems
		ctr, err := b.counters(rows)
		if err != nil {
			return err
		}
		if err := b.launchMode(pdl, name, [3]int{a.items, 1, 1}, 32*b.warps[name], smem,
			u(dl.K), u(dl.V), u(a.ind), u(a.pg), u(a.last), u(a.q), u(a.iSeq), u(a.iRow), u(a.iLo), u(a.iHi), u(a.lists), u(po), u(pl),
			u(a.rowItem), u(ctr), u(a.o), u(a.lse), uint64(s.QHeads), uint64(s.KVHeads), perHead, b2u(fuse), b2u(pdl)); err != nil {
			return err
		}
		if fuse {
			return nil
		}
		return reduce()
	}
	// CUDA-core kernels: the common parameters, then the kernel's own; then
	// quest_reduce.
	core := func(name string, smem int, own ...uint64) error {
		var args [maxParams]uint64
		n := copy(args[:], []uint64{u(dl.K), u(dl.V), u(a.ind), u(a.pg), u(a.last), u(a.q), u(a.iSeq), u(a.iRow), u(a.iLo), u(a.iHi), u(a.lists), u(po), u(pl)})
		n += copy(args[n:], own)
		if err := b.launch(name, [3]int{a.items, 1, 1}, 32*heads, smem, args[:n]...); err != nil {
			return err
		}
		return reduce()
	}
	qh, kvh, pS := uint64(s.QHeads), uint64(s.KVHeads), uint64(s.PageSize)
	if (d == 64 || d == 128) && s.PageSize <= 16 && dl.DType != plan.Float32 {
		smem := 2*3*s.PageSize*d*dl.DType.Bytes() + heads*d*4
		return core(fmt.Sprintf("quest_attends16_%s_d%d", dl.DType, d), smem, qh, kvh, pS, perHead)
	}
	stages := 3
	if dl.DType == plan.Float32 {
		stages = 2
	}
	if smem := 2 * stages * s.PageSize * d * dl.DType.Bytes(); (d == 64 || d == 128) && s.PageSize <= 32 && smem+attendStaticSmem <= maxSmem {
		return core(fmt.Sprintf("quest_attendp_%s_d%d", dl.DType, d), smem, qh, kvh, pS, perHead)
	}
	return core("quest_attend_"+dl.DType.String(), 0, qh, kvh, uint64(d), pS, perHead)
}

func b2u(x bool) uint64 {
	if x {
		return 1
	}
	return 0
}

// counters returns a buffer of at least n int32 row counters that are zero
// between launches (the fused attention kernel leaves them at zero).
func (b *Backend) counters(n int) (cu.DevicePtr, error) {
	n = max(n, 64)
	if bf, ok := b.bufs["attend.counters"]; ok && bf.size >= int64(n)*4 {
		return bf.ptr, nil
	}
	p, err := b.buf("attend.counters", int64(n)*4)
	if err != nil {
		return 0, err
	}
	if err := cu.MemsetD32(p, 0, b.bufs["attend.counters"].size/4); err != nil {
		return 0, fmt.Errorf("cuda: zero attention counters: %w", err)
	}
	return p, nil
}

// validate checks the batch against the call's pool: the device layer's or
// the host arrays'.
func validate(s kernels.Shape, l kernels.Layer, bt *kernels.Batch, withKV bool) error {
	if dl, ok := l.Device.(*DeviceLayer); ok {
		if withKV {
			return bt.ValidatePool(s, dl.kvPages()) // a slot pool is attended by slot
		}
		return bt.ValidatePool(s, dl.Pages)
	}
	if withKV {
		return bt.Validate(s, l)
	}
	return bt.ValidateSummaries(s, l)
}

func checkShape(s kernels.Shape) error {
	if err := s.Validate(); err != nil {
		return err
	}
	switch {
	case s.HeadDim%8 != 0 || s.HeadDim > 256:
		return fmt.Errorf("cuda: head dim %d must be a multiple of 8 up to 256", s.HeadDim)
	case s.Group() > 32:
		return fmt.Errorf("cuda: %d query heads per KV head (max 32)", s.Group())
	case s.PageSize > 64 || s.PageSize*s.HeadDim > 4096:
		return fmt.Errorf("cuda: page of %d x %d elements exceeds the attention tile (S <= 64, S*D <= 4096)", s.PageSize, s.HeadDim)
	}
	return nil
}

// convertKernel names the float32-to-storage conversion kernel of each
// DType (no string building per launch).
var convertKernel = [...]string{plan.Float32: "quest_convert_f32", plan.Float16: "quest_convert_f16", plan.BFloat16: "quest_convert_bf16"}

// ---- Backend ----

// Score implements kernels.Backend.
func (b *Backend) Score(ctx context.Context, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, mode kernels.GQAMode, out []float32) error {
	if err := checkShape(s); err != nil {
		return fmt.Errorf("score: %w", err)
	}
	if err := validate(s, l, bt, false); err != nil {
		return fmt.Errorf("score: %w", err)
	}
	n := bt.Len()
	rows := s.Rows(mode)
	if len(q) != n*s.QHeads*s.HeadDim || len(out) < bt.Total()*rows {
		return fmt.Errorf("score: query %d or output %d floats do not fit the batch", len(q), len(out))
	}
	return b.do(ctx, func() error {
		dl, err := b.layer(s, l, false)
		if err != nil {
			return err
		}
		ind, err := upload(b, "indptr", bt.Indptr)
		if err != nil {
			return err
		}
		var pg cu.DevicePtr
		if bt.Tables != nil {
			if err := b.tablePtrs(bt, dl.Pages); err != nil {
				return err
			}
			tp, err := upload(b, "tables", b.tabs)
			if err != nil {
				return err
			}
			if pg, err = b.gatherPages(bt, tp, ind); err != nil {
				return err
			}
		} else if pg, err = upload(b, "pages", bt.Pages); err != nil {
			return err
		}
		qp, err := upload(b, "q", q)
		if err != nil {
			return err
		}
		op, err := b.buf("scores", int64(bt.Total()*rows)*4)
		if err != nil {
			return err
		}
		perHead := uint64(0)
		if mode == kernels.PerHead {
			perHead = 1
		}
		if _, err := b.launchScore(dl, s, n, bt.MaxPages(), ind, pg, qp, op, 0, perHead); err != nil {
			return err
		}
		return download(b, out[:bt.Total()*rows], op)
	})
}

// TopK implements kernels.Backend.
func (b *Backend) TopK(ctx context.Context, scores []float32, plan *kernels.TopKPlan, out []int32) error {
	n := plan.Rows()
	outLen, err := plan.Check(len(scores), len(out))
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	return b.do(ctx, func() error {
		sp, err := upload(b, "topk.scores", scores)
		if err != nil {
			return err
		}
		var ptrs [5]cu.DevicePtr
		for i, a := range [][]int32{plan.ScoreOff, plan.N, plan.Base, plan.K, plan.OutOff} {
			if ptrs[i], err = upload(b, fmt.Sprintf("topk.plan%d", i), a); err != nil {
				return err
			}
		}
		op, err := b.buf("topk.out", int64(outLen)*4)
		if err != nil {
			return err
		}
		if err := b.launchTopK(plan, sp, 0, ptrs, op, false); err != nil {
			return err
		}
		// Rows write disjoint ranges; copy back only what they wrote.
		tmp := make([]int32, outLen)
		copy(tmp, out)
		if err := download(b, tmp, op); err != nil {
			return err
		}
		for r := range n {
			oo, m := int(plan.OutOff[r]), min(int(plan.K[r]), int(plan.N[r]))
			copy(out[oo:oo+max(m, 0)], tmp[oo:])
		}
		return nil
	})
}

// Attend implements kernels.Backend.
func (b *Backend) Attend(ctx context.Context, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, lists *kernels.Lists, o, lse []float32) error {
	if err := b.checkAttend(s, l, bt, q, lists, o, lse); err != nil {
		return fmt.Errorf("attend: %w", err)
	}
	if _, err := lists.Check(bt, s.Rows(lists.Mode), nil); err != nil {
		return fmt.Errorf("attend: %w", err)
	}
	return b.do(ctx, func() error {
		dl, a, err := b.prepareAttend(s, l, bt, q, lists, nil)
		if err != nil {
			return err
		}
		heads, perHead := headsOf(s, lists.Mode)
		if err := b.launchAttendReduce(dl, s, heads, perHead, a, false); err != nil {
			return err
		}
		return b.receiveOut(o, lse, nil, a)
	})
}

// checkAttend validates the arguments of an attention call (the lists'
// entries are checked by the caller).
func (b *Backend) checkAttend(s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, lists *kernels.Lists, o, lse []float32) error {
	if err := checkShape(s); err != nil {
		return err
	}
	if err := validate(s, l, bt, true); err != nil {
		return err
	}
	n := bt.Len()
	hq, d := s.QHeads, s.HeadDim
	if len(q) != n*hq*d || len(o) != n*hq*d || len(lse) != n*hq {
		return fmt.Errorf("query %d, o %d or lse %d floats do not fit the batch", len(q), len(o), len(lse))
	}
	rows := s.Rows(lists.Mode)
	if !lists.All && (len(lists.Indptr) != n*rows+1 || lists.Indptr[0] != 0 || int(lists.Indptr[n*rows]) != len(lists.Pages)) {
		return fmt.Errorf("lists indptr has %d entries for %d rows and %d pages", len(lists.Indptr), n*rows, len(lists.Pages))
	}
	return nil
}

// iota returns a device array holding 0, 1, ..., n-1 at least: the list
// of every page read by position, which serves lists of every page
// (kernels.Lists.All) without building or moving them.
func (b *Backend) iota(n int) (cu.DevicePtr, error) {
	if bf, ok := b.bufs["iota"]; ok && bf.size >= int64(n)*4 {
		return bf.ptr, nil
	}
	p, err := b.buf("iota", int64(n)*4)
	if err != nil {
		return 0, err
	}
	all := make([]int32, b.bufs["iota"].size/4)
	for i := range all {
		all[i] = int32(i)
	}
	if err := cu.MemcpyHtoD(p, unsafe.Pointer(&all[0]), int64(len(all))*4); err != nil {
		return 0, fmt.Errorf("cuda: fill the page iota: %w", err)
	}
	return p, nil
}

// headsOf returns the query heads an attention row serves and the kernels'
// per_head flag.
func headsOf(s kernels.Shape, mode kernels.GQAMode) (int, uint64) {
	if mode == kernels.PerHead {
		return 1, 1
	}
	return s.Group(), 0
}

// prepareAttend builds the work items of an attention call over lists,
// packs the batch, the queries, the lists, the items and whatever extra
// adds (it gets the packing to add to and is called before the copy) into
// one upload, and lays out the outputs o, lse (and a copy of the lists)
// in one output buffer (device goroutine only). It returns the pointers in
// attendArgs; b.out describes the output buffer for receiveOut.
func (b *Backend) prepareAttend(s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, lists *kernels.Lists, extra func(*packed)) (*DeviceLayer, attendArgs, error) {
	n := bt.Len()
	rows := s.Rows(lists.Mode)
	dt := b.cfg.DType
	if dl, ok := l.Device.(*DeviceLayer); ok {
		dt = dl.DType
	}
	listed := len(lists.Pages)
	if lists.All {
		listed = bt.Total() * rows
	}
	chunk := int32(b.chunkFor(s, dt, listed))
	// Work items, built in the device goroutine's reused slices. They
	// cover list positions, or pages when the lists are every page (read
	// through the iota array: position = page).
	it := &b.items
	for i := range it {
		it[i] = it[i][:0]
	}
	minItems, maxItems := math.MaxInt, 0
	for row := range n * rows {
		lo, hi := int32(0), int32(bt.NumPages(row/rows))
		if !lists.All {
			lo, hi = lists.Indptr[row], lists.Indptr[row+1]
		}
		ni := int((hi - lo + chunk - 1) / chunk)
		minItems, maxItems = min(minItems, ni), max(maxItems, ni)
		it[4] = append(it[4], int32(len(it[0])))
		for p := lo; p < hi; p += chunk {
			it[0] = append(it[0], int32(row/rows))
			it[1] = append(it[1], int32(row%rows))
			it[2] = append(it[2], p)
			it[3] = append(it[3], min(p+chunk, hi))
		}
	}
	it[4] = append(it[4], int32(len(it[0])))
	dl, err := b.layer(s, l, true)
	if err != nil {
		return nil, attendArgs{}, err
	}
	in := &b.in
	in.reset()
	pages := bt.Pages
	if bt.Tables != nil {
		if err := b.tablePtrs(bt, dl.Pages); err != nil {
			return nil, attendArgs{}, err
		}
		pages = b.tabs // the tables' addresses; the list is gathered below
	}
	listPages := lists.Pages
	if lists.All {
		listPages = nil // unused: pages are read by position through the iota
	}
	var idx [9]int
	for i, a := range [9][]int32{bt.Indptr, pages, bt.LastLen, it[0], it[1], it[2], it[3], listPages, it[4]} {
		idx[i] = pack(in, a)
	}
	iq := pack(in, q)
	if extra != nil {
		extra(in)
	}
	if err := b.send(in, "call.in"); err != nil {
		return nil, attendArgs{}, err
	}
	pg := in.ptr(idx[1])
	switch {
	case bt.Tables != nil && n == 1:
		// One sequence: its table is the batch's page list.
		pg = cu.DevicePtr(uint64(uint32(b.tabs[0])) | uint64(uint32(b.tabs[1]))<<32)
	case bt.Tables != nil:
		if pg, err = b.gatherPages(bt, pg, in.ptr(idx[0])); err != nil {
			return nil, attendArgs{}, err
		}
	}
	lp := in.ptr(idx[7])
	if lists.All {
		if lp, err = b.iota(max(bt.MaxPages(), 1)); err != nil {
			return nil, attendArgs{}, err
		}
	}
	// The outputs go to the staging buffer, which the attention kernels
	// write through its device mapping: no device-to-host copy of o and
	// lse (the lists come back with one copy).
	out := &b.out
	out.reset()
	out.region(int64(n*s.QHeads*s.HeadDim) * 4) // outO
	out.region(int64(n*s.QHeads) * 4)           // outLSE
	out.region(int64(len(listPages)) * 4)       // outLists
	if out.host, err = b.stage(out.total); err != nil {
		return nil, attendArgs{}, err
	}
	out.base = b.pin.devAt(out.host)
	b.staged = true
	return dl, attendArgs{
		ind: in.ptr(idx[0]), pg: pg, last: in.ptr(idx[2]), q: in.ptr(iq), iSeq: in.ptr(idx[3]), iRow: in.ptr(idx[4]),
		iLo: in.ptr(idx[5]), iHi: in.ptr(idx[6]), lists: lp, rowItem: in.ptr(idx[8]),
		o: out.ptr(outO), lse: out.ptr(outLSE), items: len(it[0]), nrows: n * rows, minItemsPerRow: minItems, maxItemsPerRow: maxItems,
	}, nil
}

// The regions of b.out that prepareAttend lays out, in order.
const (
	outO = iota
	outLSE
	outLists
)

// receiveOut waits for the call's kernels and brings back the outputs
// laid out by prepareAttend: o and lse from the staging buffer the
// kernels wrote, and, when lists is not nil, the device lists (one copy
// into the staging buffer).
func (b *Backend) receiveOut(o, lse []float32, lists []int32, a attendArgs) error {
	out := &b.out
	if len(lists) > 0 {
		if err := cu.MemcpyDtoHAsync(unsafe.Add(out.host, out.offs[outLists]), a.lists, int64(len(lists))*4, cu.Stream{}); err != nil {
			return fmt.Errorf("cuda: copy lists: %w", err)
		}
	}
	if err := cu.Synchronize(); err != nil {
		return fmt.Errorf("cuda: wait for the step: %w", err)
	}
	b.settle() // out.host stays valid until the next stage
	copy(o, unsafe.Slice((*float32)(unsafe.Add(out.host, out.offs[outO])), len(o)))
	copy(lse, unsafe.Slice((*float32)(unsafe.Add(out.host, out.offs[outLSE])), len(lse)))
	copy(lists, unsafe.Slice((*int32)(unsafe.Add(out.host, out.offs[outLists])), len(lists)))
	out.reset()
	return nil
}

// queueOut records the outputs laid out by prepareAttend for the next
// settle (StepQueued).
func (b *Backend) queueOut(o, lse []float32) {
	out := &b.out
	b.pending = append(b.pending, pendingOut{o, unsafe.Add(out.host, out.offs[outO])}, pendingOut{lse, unsafe.Add(out.host, out.offs[outLSE])})
	out.reset()
}

// Step implements kernels.Stepper: the batch, queries, lists and plan go
// up once; score, top-K (writing straight into the device lists) and
// attention run back to back on the device (top-K and attention as
// programmatic dependents where the kernels allow); the attention writes
// o and lse into mapped host memory and the lists come back in one copy.
func (b *Backend) Step(ctx context.Context, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error {
	return b.step(ctx, false, s, l, bt, q, plan, lists, o, lse)
}

// StepQueued implements kernels.QueuedStepper: Step's device work, queued
// without waiting for it; o and lse are filled from the staging buffer at
// the next synchronization (Sync, or any call that waits for the device).
func (b *Backend) StepQueued(ctx context.Context, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error {
	return b.step(ctx, true, s, l, bt, q, plan, lists, o, lse)
}

// Sync implements kernels.QueuedStepper: it waits for every queued step
// and fills their outputs.
// It waits for its turn whatever ctx (at most one call), so that no
// queued output is written after it returns; when the device fails, the
// queued outputs are dropped unwritten.
func (b *Backend) Sync(ctx context.Context) error {
	return b.do(context.WithoutCancel(ctx), func() error {
		if err := cu.Synchronize(); err != nil {
			clear(b.pending)
			b.pending = b.pending[:0]
			return fmt.Errorf("cuda: sync: %w", err)
		}
		b.settle()
		return nil
	})
}

func (b *Backend) step(ctx context.Context, queued bool, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error {
	b.stepMu.Lock()
	defer b.stepMu.Unlock()
	b.probe.enter()
	if err := b.checkStep(s, l, bt, q, plan, lists, o, lse); err != nil {
		return err
	}
	return b.do(ctx, func() error { return b.stepDevice(queued, s, l, bt, q, plan, lists, o, lse) })
}

// checkStep validates a Step call (b.stepMu held).
func (b *Backend) checkStep(s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error {
	if err := b.checkAttend(s, l, bt, q, lists, o, lse); err != nil {
		return fmt.Errorf("step: %w", err)
	}
	return b.stepCheck.Check(bt, s.Rows(lists.Mode), plan, lists)
}

// stepDevice is a checked Step's device work (device goroutine only):
// queued leaves the outputs to the next settle.
func (b *Backend) stepDevice(queued bool, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error {
	// Tile maxima serve the threshold top-K when every plan row starts at
	// its score row's start.
	tiles := true
	for r := range plan.Rows() {
		tiles = tiles && plan.Base[r] == 0
	}
	if err := b.probe.mark(0); err != nil {
		return err
	}
	var pi [5]int
	dl, a, err := b.prepareAttend(s, l, bt, q, lists, func(in *packed) {
		for i, x := range [][]int32{plan.ScoreOff, plan.N, plan.Base, plan.K, plan.OutOff} {
			pi[i] = pack(in, x)
		}
	})
	if err != nil {
		return err
	}
	if err := b.probe.mark(1); err != nil {
		return err
	}
	var ptrs [5]cu.DevicePtr
	for i := range ptrs {
		ptrs[i] = b.in.ptr(pi[i])
	}
	heads, perHead := headsOf(s, lists.Mode)
	if plan.Rows() > 0 {
		if _, err := b.scoreTopK(dl, s, bt, lists.Mode, plan, a.ind, a.pg, a.q, ptrs, a.lists, tiles); err != nil {
			return err
		}
	}
	if err := b.launchAttendReduce(dl, s, heads, perHead, a, plan.Rows() > 0); err != nil {
		return err
	}
	if err := b.probe.mark(2); err != nil {
		return err
	}
	if queued {
		b.queueOut(o, lse)
		return nil
	}
	var back []int32 // the lists with the top-K's picks
	if !lists.All {
		back = lists.Pages
	}
	if err := b.receiveOut(o, lse, back, a); err != nil {
		return err
	}
	return b.probe.done()
}

// rowStarts reports whether every plan row that reads tile maxima (0 < K
// < N) ranks a prefix of one score row of the batch: candidates from the
// row's start, at most the row's length (the tiles the score kernel writes
// for that row).
func rowStarts(bt *kernels.Batch, rows int, plan *kernels.TopKPlan) bool {
	for r := range plan.Rows() {
		if plan.K[r] <= 0 || plan.K[r] >= plan.N[r] {
			continue // no tile maximum is read
		}
		off := int(plan.ScoreOff[r])
		// The sequence whose scores hold off: the last i with
		// Indptr[i]*rows <= off.
		i := sort.Search(bt.Len(), func(i int) bool { return int(bt.Indptr[i+1])*rows > off })
		if i >= bt.Len() {
			return false
		}
		np := bt.NumPages(i)
		if np == 0 || (off-bt.ScoreOffset(i, rows))%np != 0 || int(plan.N[r]) > np {
			return false
		}
	}
	return true
}

// scoreTopK scores the batch (device arrays ind, pg, qp) into the scratch
// buffer "scores", with tile maxima when tiles is set and the tensor-core
// kernel writes them, and launches plan's top-K over them into out as a
// programmatic dependent of the score kernel. It returns the scores
// (device goroutine only).
func (b *Backend) scoreTopK(dl *DeviceLayer, s kernels.Shape, bt *kernels.Batch, mode kernels.GQAMode, plan *kernels.TopKPlan, ind, pg, qp cu.DevicePtr, ptrs [5]cu.DevicePtr, out cu.DevicePtr, tiles bool) (cu.DevicePtr, error) {
	nScores := int64(bt.Total() * s.Rows(mode))
	sp, err := b.buf("scores", nScores*4)
	if err != nil {
		return 0, err
	}
	tmax := cu.DevicePtr(0)
	if tiles && b.scoreWritesTiles(s, dl) {
		if tmax, err = b.buf("step.tmax", nScores*4); err != nil {
			return 0, err
		}
	}
	_, perHead := headsOf(s, mode)
	wrote, err := b.launchScore(dl, s, bt.Len(), bt.MaxPages(), ind, pg, qp, sp, tmax, perHead)
	if err != nil {
		return 0, err
	}
	if !wrote {
		tmax = 0
	}
	return sp, b.launchTopK(plan, sp, tmax, ptrs, out, true)
}

// Rank implements kernels.Ranker: the batch, queries and plan go up in one
// copy; score, top-K (a programmatic dependent of the score) and a kernel
// that picks the chosen pages' scores run back to back; the chosen pages
// and their scores come back in one copy. The scores stay on the device.
func (b *Backend) Rank(ctx context.Context, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, mode kernels.GQAMode, plan *kernels.TopKPlan, out []int32, outScores []float32) error {
	if err := checkShape(s); err != nil {
		return fmt.Errorf("rank: %w", err)
	}
	if err := validate(s, l, bt, false); err != nil {
		return fmt.Errorf("rank: %w", err)
	}
	outLen, err := kernels.CheckRank(s, bt, mode, plan, out, outScores)
	if err != nil {
		return err
	}
	n := bt.Len()
	if len(q) != n*s.QHeads*s.HeadDim {
		return fmt.Errorf("rank: query has %d floats, want %d", len(q), n*s.QHeads*s.HeadDim)
	}
	if plan.Rows() == 0 || outLen == 0 {
		return nil
	}
	rows := s.Rows(mode)
	tiles := rowStarts(bt, rows, plan)
	return b.do(ctx, func() error {
		dl, err := b.layer(s, l, false)
		if err != nil {
			return err
		}
		in := &b.in
		in.reset()
		pages := bt.Pages
		if bt.Tables != nil {
			if err := b.tablePtrs(bt, dl.Pages); err != nil {
				return err
			}
			pages = b.tabs
		}
		iInd, iPg, iQ := pack(in, bt.Indptr), pack(in, pages), pack(in, q)
		var pi [5]int
		for i, x := range [][]int32{plan.ScoreOff, plan.N, plan.Base, plan.K, plan.OutOff} {
			pi[i] = pack(in, x)
		}
		if err := b.send(in, "rank.in"); err != nil {
			return err
		}
		ind, pg := in.ptr(iInd), in.ptr(iPg)
		if bt.Tables != nil {
			if pg, err = b.gatherPages(bt, pg, ind); err != nil {
				return err
			}
		}
		var ptrs [5]cu.DevicePtr
		for i := range ptrs {
			ptrs[i] = in.ptr(pi[i])
		}
		o := &b.out
		o.reset()
		iOut, iSc := o.region(int64(outLen)*4), o.region(int64(outLen)*4)
		if o.base, err = b.buf("rank.out", o.total); err != nil {
			return err
		}
		sp, err := b.scoreTopK(dl, s, bt, mode, plan, ind, pg, in.ptr(iQ), ptrs, o.ptr(iOut), tiles)
		if err != nil {
			return err
		}
		if err := b.launch("quest_pick_scores", [3]int{plan.Rows(), 1, 1}, 128, 0, u(sp), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(o.ptr(iOut)), u(o.ptr(iSc))); err != nil {
			return err
		}
		b.rankOut = slices.Grow(b.rankOut[:0], outLen)[:outLen]
		b.rankScores = slices.Grow(b.rankScores[:0], outLen)[:outLen]
		setHost(o, iOut, b.rankOut)
		setHost(o, iSc, b.rankScores)
		if err := b.receive(o); err != nil {
			return err
		}
		// Rows write disjoint ranges; copy back only what they wrote.
		for r := range plan.Rows() {
			oo, m := int(plan.OutOff[r]), max(min(int(plan.K[r]), int(plan.N[r])), 0)
			copy(out[oo:oo+m], b.rankOut[oo:])
			copy(outScores[oo:oo+m], b.rankScores[oo:])
		}
		return nil
	})
}

// Merge implements kernels.Backend.
func (b *Backend) Merge(ctx context.Context, dim int, o, lse, o2, lse2 []float32) error {
	if dim <= 0 || len(lse) != len(lse2) || len(o) != len(lse)*dim || len(o2) != len(o) {
		return fmt.Errorf("merge: sizes o=%d lse=%d o2=%d lse2=%d dim=%d do not match", len(o), len(lse), len(o2), len(lse2), dim)
	}
	return b.do(ctx, func() error {
		var p [4]cu.DevicePtr
		var err error
		for i, a := range [][]float32{o, lse, o2, lse2} {
			if p[i], err = upload(b, fmt.Sprintf("merge.%d", i), a); err != nil {
				return err
			}
		}
		n := len(lse)
		if err := b.launch("quest_merge", [3]int{(n + 7) / 8, 1, 1}, 256, 0, u(p[0]), u(p[1]), u(p[2]), u(p[3]), uint64(n), uint64(dim)); err != nil {
			return err
		}
		if err := download(b, o, p[0]); err != nil {
			return err
		}
		return download(b, lse, p[1])
	})
}
