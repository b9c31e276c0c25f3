//go:build cuda

package cuda

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Host-device transfers (device goroutine only): named scratch buffers,
// the pinned staging buffer, uploads and downloads, the packing of a
// call's arrays into one copy, and conversion to and from the storage
// types.

// buf returns a scratch buffer named name of at least n bytes.
func (b *Backend) buf(name string, n int64) (cu.DevicePtr, error) {
	n = max(n, 256)
	if bf, ok := b.bufs[name]; ok && bf.size >= n {
		return bf.ptr, nil
	} else if ok {
		cu.MemFree(bf.ptr)
		delete(b.bufs, name)
		if k := b.kept[name]; k != nil {
			k.forget() // a new allocation may reuse the address
		}
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
func upload[T int32 | int64 | float32 | float64](b *Backend, name string, s []T) (cu.DevicePtr, error) {
	n := int64(len(s)) * int64(unsafe.Sizeof(*new(T)))
	p, err := b.buf(name, n)
	if err != nil || len(s) == 0 {
		return p, err
	}
	k := b.kept[name]
	img := unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), n)
	if k != nil && !b.cfg.AlwaysUpload && k.same(p, img) {
		b.skipped++
		return p, nil
	}
	src, err := b.stage(n)
	if err != nil {
		return 0, err
	}
	copy(unsafe.Slice((*T)(src), len(s)), s)
	if err := cu.MemcpyHtoDAsync(p, src, n, cu.Stream{}); err != nil {
		if k != nil {
			k.forget()
		}
		return 0, fmt.Errorf("cuda: upload %s: %w", name, err)
	}
	if k != nil {
		k.keep(p, img)
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
func download[T int32 | int64 | float32](b *Backend, dst []T, src cu.DevicePtr) error {
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

// image appends p's layout and the bytes of its host arrays to dst (the
// 256-byte padding between arrays left out): two calls whose images are
// equal copy the same bytes to the same places.
func (p *packed) image(dst []byte) []byte {
	for i := range p.n {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(p.offs[i]))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(p.sizes[i]))
		if p.sizes[i] > 0 && p.srcs[i] != nil {
			dst = append(dst, unsafe.Slice((*byte)(p.srcs[i]), p.sizes[i])...)
		}
	}
	return binary.LittleEndian.AppendUint64(dst, uint64(p.total))
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
	k := b.kept[name]
	if k != nil {
		b.image = p.image(b.image[:0])
		if !b.cfg.AlwaysUpload && k.same(dev, b.image) {
			clear(p.srcs[:p.n]) // keep no reference to the caller's arrays
			b.skipped++
			return nil
		}
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
		if k != nil {
			k.forget()
		}
		return fmt.Errorf("cuda: upload %s: %w", name, err)
	}
	if k != nil {
		k.keep(dev, b.image)
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

// convertKernel names the float32-to-storage conversion kernel of each
// DType (no string building per launch).
var convertKernel = [...]string{plan.Float32: "quest_convert_f32", plan.Float16: "quest_convert_f16", plan.BFloat16: "quest_convert_bf16"}

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

// Names of the scratch buffers whose uploads are skipped when the device
// already holds their bytes.
const (
	keptCallIn      = "call.in"   // a step or attention call's packed inputs (prepareAttend)
	keptAppendPages = "append.pt" // an append's page table (appendFrom, the slot pools' append)
)

// keptCopy remembers what the last upload into one scratch buffer copied
// there, so that an upload of the same bytes to the same allocation can be
// skipped. A decode step queues the same inputs for every layer: the batch,
// its page tables' addresses, the work items, the top-K plan and the page
// of the new token are the same from one layer to the next (each layer has
// its own pool, addressed by the same pages), and each copy is an operation
// in the stream between two kernels (it ends their programmatic overlap).
//
// A buffer qualifies only when no kernel changes its device bytes in a way
// that a later call with the same bytes would read before rewriting them:
// append.pt is only read; in call.in, a step's top-K writes its picks into
// the lists region, and a call with the same image has the same plan, so
// its own top-K rewrites the same places before its attention reads them
// (a call of another kind packs other arrays: its image differs). buf
// forgets a buffer's copy when it reallocates it.
type keptCopy struct {
	ptr  cu.DevicePtr
	data []byte
	ok   bool
}

// same reports whether the last upload copied img to ptr.
func (k *keptCopy) same(ptr cu.DevicePtr, img []byte) bool {
	return k.ok && k.ptr == ptr && bytes.Equal(k.data, img)
}

// keep records that img was copied to ptr.
func (k *keptCopy) keep(ptr cu.DevicePtr, img []byte) {
	k.ptr, k.data, k.ok = ptr, append(k.data[:0], img...), true
}

// forget drops the record (the buffer was freed or its upload failed).
func (k *keptCopy) forget() { k.ok = false }
