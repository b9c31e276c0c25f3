//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Split-K sparse paged attention (attend.cuh and mma.cu): work items,
// the one upload and one output buffer of a call, and the kernels with
// the reduce of their partial states.

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
		tab, err := slotUse(l, dl)
		if err != nil {
			return err
		}
		if tab != nil {
			if err := b.bySlot(tab, bt.Total(), &a, false, 0, false); err != nil {
				return err
			}
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
	return b.checkAttendLens(s, l, bt, len(q), lists, len(o), len(lse))
}

// checkAttendLens is checkAttend for q, o and lse of nq, no and nlse
// floats.
func (b *Backend) checkAttendLens(s kernels.Shape, l kernels.Layer, bt *kernels.Batch, nq int, lists *kernels.Lists, no, nlse int) error {
	if err := checkShape(s); err != nil {
		return err
	}
	if err := validate(s, l, bt, true); err != nil {
		return err
	}
	n := bt.Len()
	hq, d := s.QHeads, s.HeadDim
	if nq != n*hq*d || no != n*hq*d || nlse != n*hq {
		return fmt.Errorf("query %d, o %d or lse %d floats do not fit the batch", nq, no, nlse)
	}
	rows := s.Rows(lists.Mode)
	if !lists.All && (len(lists.Indptr) != n*rows+1 || lists.Indptr[0] != 0 || int(lists.Indptr[n*rows]) != len(lists.Pages)) {
		return fmt.Errorf("lists indptr has %d entries for %d rows and %d pages", len(lists.Indptr), n*rows, len(lists.Pages))
	}
	return nil
}

// headsOf returns the query heads an attention row serves and the kernels'
// per_head flag.
func headsOf(s kernels.Shape, mode kernels.GQAMode) (int, uint64) {
	if mode == kernels.PerHead {
		return 1, 1
	}
	return s.Group(), 0
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
	if err := b.send(in, keptCallIn); err != nil {
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
	if useMMA(s, dt) || (dt == plan.FP8 && b.useMMA8(s)) {
		return attendChunkMMA(b.cfg.AttendChunk, listed)
	}
	return attendChunk(b.cfg.AttendChunk, listed)
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
	if kv8 := dl.kv8() && b.useMMA8(s); kv8 || useMMA(s, dl.DType) {
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
		// fp8 records: the scales follow K and V. A fixed array keeps the
		// launch free of allocations.
		var args [maxParams]uint64
		n := copy(args[:], []uint64{u(dl.K), u(dl.V)})
		if kv8 {
			n += copy(args[n:], []uint64{u(dl.KScale), u(dl.VScale)})
		}
		n += copy(args[n:], []uint64{u(a.ind), u(a.pg), u(a.last), u(a.q), u(a.iSeq), u(a.iRow), u(a.iLo), u(a.iHi), u(a.lists), u(po), u(pl),
			u(a.rowItem), u(ctr), u(a.o), u(a.lse), uint64(s.QHeads), uint64(s.KVHeads), perHead, b2u(fuse), b2u(pdl)})
		if err := b.launchMode(pdl, name, [3]int{a.items, 1, 1}, 32*b.warps[name], smem, args[:n]...); err != nil {
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
	if dl.kv8() {
		// fp8 records: the one kernel that dequantizes in shared memory
		// (kvfp8.cuh); its parameters put the scales after K and V.
		if err := b.launch("quest_attend_fp8", [3]int{a.items, 1, 1}, 32*heads, 0,
			u(dl.K), u(dl.V), u(dl.KScale), u(dl.VScale), u(a.ind), u(a.pg), u(a.last), u(a.q), u(a.iSeq), u(a.iRow), u(a.iLo), u(a.iHi), u(a.lists), u(po), u(pl),
			qh, kvh, uint64(d), pS, perHead); err != nil {
			return err
		}
		return reduce()
	}
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
