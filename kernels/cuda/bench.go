//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"slices"
	"time"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// BenchConfig sizes BenchAttention. Zero fields take the defaults noted.
type BenchConfig struct {
	Contexts []int      // tokens per sequence (4K, 16K, 32K, 128K, 512K, 1M)
	Batches  []int      // sequences per step (1, 8)
	Budgets  []int      // token budgets (1024, 2048, 4096)
	QHeads   int        // 32
	KVHeads  int        // 8
	HeadDim  int        // 128
	PageSize int        // 16
	DType    plan.DType // storage type (the zero value is plan.Float32)
	Iters    int        // timed repetitions per phase, median reported (20)
	// MaxBytes skips configurations whose K+V exceed it (64 GiB).
	MaxBytes int64
}

// BenchResult is one JSON line of `questctl bench attention --backend cuda`.
type BenchResult struct {
	Backend string `json:"backend"`
	DType   string `json:"dtype"`
	// SummaryDType is "fp8" when the score read fp8 summaries (the
	// backend's Config.SummaryDType), omitted otherwise.
	SummaryDType string  `json:"summary_dtype,omitempty"`
	Context      int     `json:"context"`
	Batch        int     `json:"batch"`
	Budget       int     `json:"budget"`
	PageSize     int     `json:"page_size"`
	QHeads       int     `json:"q_heads"`
	KVHeads      int     `json:"kv_heads"`
	HeadDim      int     `json:"head_dim"`
	DenseUS      float64 `json:"dense_us"`
	QuestUS      float64 `json:"quest_us"`
	ScoreUS      float64 `json:"score_us"`
	TopKUS       float64 `json:"topk_us"`
	// TopKStepUS is the top-K timed right after the score kernel (its
	// input fresh in L2, as inside a Quest step); TopKUS starts from a cold
	// L2 like the other phases.
	TopKStepUS float64 `json:"topk_step_us"`
	AttendUS   float64 `json:"attend_us"` // sparse attention + reduce
	// QuestLatencyUS is one Quest step launched alone on an idle GPU
	// (median of Iters, host launch gaps included); the other times are GPU
	// time per call from a cold L2 with the launches queued ahead (see
	// Backend.cold).
	QuestLatencyUS float64 `json:"quest_latency_us"`
	// ServedUS is the same step as a caller of Backend.Step sees it: wall
	// time of one call (upload of the batch, queries, plan and lists;
	// device page tables; the kernels; o, lse and the lists back), from a
	// cold L2, median of Iters. ServedQueuedUS is the wall time of
	// servedQueue calls of Backend.StepQueued and one Sync, per call (the
	// stream-ordered path of a caller running many layers); its calls
	// repeat the same layer, so L2 is warm where the layer's summaries
	// fit in it (up to about 128K tokens at bf16).
	ServedUS       float64 `json:"served_us"`
	ServedQueuedUS float64 `json:"served_queued_us"`
	Speedup        float64 `json:"speedup"`
	BytesRead      int64   `json:"bytes_read"`
	BytesDense     int64   `json:"bytes_dense"`
	RhoFormula     float64 `json:"rho_formula"`
	DenseGBps      float64 `json:"dense_gbps"`
	ScoreGBps      float64 `json:"score_gbps"`
	AttendGBps     float64 `json:"attend_gbps"`
	CopyGBps       float64 `json:"copy_gbps"` // device-to-device copy, bytes read + written
	// Roofline times: bytes / copy bandwidth.
	RooflineDenseUS float64 `json:"roofline_dense_us"`
	RooflineQuestUS float64 `json:"roofline_quest_us"`
	DenseOfCopy     float64 `json:"dense_of_copy"` // dense GB/s over copy GB/s
	Iters           int     `json:"iters"`
}

// BenchAttention times one layer of Quest (score, top-K, sparse attention
// and reduce, each phase alone and the whole pipeline) against the dense
// kernel (the same attention kernel over every page) on device-resident
// random data, with CUDA events, median of Iters, and the device copy
// bandwidth measured in the same run. The tail page is always attended and
// never ranked (K-1 pages ranked).
func (b *Backend) BenchAttention(ctx context.Context, cfg BenchConfig, emit func(BenchResult) error) error {
	if len(cfg.Contexts) == 0 {
		cfg.Contexts = []int{4096, 16384, 32768, 131072, 524288, 1048576}
	}
	if len(cfg.Batches) == 0 {
		cfg.Batches = []int{1, 8}
	}
	if len(cfg.Budgets) == 0 {
		cfg.Budgets = []int{1024, 2048, 4096}
	}
	cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = def(cfg.QHeads, 32), def(cfg.KVHeads, 8), def(cfg.HeadDim, 128), def(cfg.PageSize, 16)
	cfg.Iters = def(cfg.Iters, 20)
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = 64 << 30
	}
	var copyGBps float64
	if err := b.do(ctx, func() error {
		var err error
		copyGBps, err = b.copyBandwidth(2<<30, cfg.Iters)
		return err
	}); err != nil {
		return err
	}
	for _, batch := range cfg.Batches {
		for _, n := range cfg.Contexts {
			var results []BenchResult
			err := b.do(ctx, func() error {
				var err error
				results, err = b.benchOne(cfg, n, batch, copyGBps)
				return err
			})
			if err != nil {
				return fmt.Errorf("bench cuda context %d batch %d: %w", n, batch, err)
			}
			for _, r := range results {
				if err := emit(r); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func def(x, d int) int {
	if x == 0 {
		return d
	}
	return x
}

type timer struct{ start, end cu.Event }

func newTimer() (timer, error) {
	s, err := cu.MakeEvent(cu.DefaultEvent)
	if err != nil {
		return timer{}, err
	}
	e, err := cu.MakeEvent(cu.DefaultEvent)
	if err != nil {
		cu.DestroyEvent(&s)
		return timer{}, err
	}
	return timer{s, e}, nil
}

func (t timer) destroy() { cu.DestroyEvent(&t.start); cu.DestroyEvent(&t.end) }

// median times f (which launches work on the default stream) iters times
// after one warm-up and returns the median in microseconds.
func (t timer) median(iters int, f func() error) (float64, error) {
	if err := f(); err != nil {
		return 0, err
	}
	if err := cu.Synchronize(); err != nil {
		return 0, err
	}
	var xs []float64
	for range iters {
		if err := t.start.Record(cu.Stream{}); err != nil {
			return 0, err
		}
		if err := f(); err != nil {
			return 0, err
		}
		if err := t.end.Record(cu.Stream{}); err != nil {
			return 0, err
		}
		if err := t.end.Synchronize(); err != nil {
			return 0, err
		}
		ms, err := t.start.Elapsed(t.end)
		if err != nil {
			return 0, err
		}
		xs = append(xs, ms*1e3)
	}
	slices.Sort(xs)
	return xs[len(xs)/2], nil
}

// l2Flush is the size of the buffer written before each timed call so that
// the call starts with a cold L2 (H200: 50 MiB of L2).
const l2Flush = 256 << 20

// cold times iters calls of f, each after a write of a 256 MiB buffer that
// evicts L2, with a pair of events around each call, and returns the
// median GPU time per call in microseconds. Everything is queued without a
// host sync, so the host's launch overhead hides behind the flush (as
// behind the previous layer's work in a decode loop) instead of showing up
// as idle GPU time.
func (b *Backend) cold(iters int, f func() error) (float64, error) {
	return b.coldAfter(iters, nil, f)
}

// coldAfter is cold with pre (untimed) run between the flush and the start
// event: f is timed with pre's output fresh in L2, as it is inside a Quest
// step.
func (b *Backend) coldAfter(iters int, pre, f func() error) (float64, error) {
	flush, err := b.buf("bench.flush", l2Flush)
	if err != nil {
		return 0, err
	}
	if err := f(); err != nil { // warm-up
		return 0, err
	}
	evs := make([]cu.Event, 2*iters)
	defer func() {
		for i := range evs {
			if evs[i] != (cu.Event{}) {
				cu.DestroyEvent(&evs[i])
			}
		}
	}()
	for i := range evs {
		if evs[i], err = cu.MakeEvent(cu.DefaultEvent); err != nil {
			return 0, err
		}
	}
	for i := range iters {
		if err := cu.MemsetD32Async(flush, uint(i), l2Flush/4, cu.Stream{}); err != nil {
			return 0, err
		}
		if pre != nil {
			if err := pre(); err != nil {
				return 0, err
			}
		}
		if err := evs[2*i].Record(cu.Stream{}); err != nil {
			return 0, err
		}
		if err := f(); err != nil {
			return 0, err
		}
		if err := evs[2*i+1].Record(cu.Stream{}); err != nil {
			return 0, err
		}
	}
	if err := cu.Synchronize(); err != nil {
		return 0, err
	}
	xs := make([]float64, iters)
	for i := range iters {
		ms, err := evs[2*i].Elapsed(evs[2*i+1])
		if err != nil {
			return 0, err
		}
		xs[i] = ms * 1e3
	}
	slices.Sort(xs)
	return xs[len(xs)/2], nil
}

// copyBandwidth times a device-to-device copy of size bytes: GB/s counting
// bytes read plus bytes written.
func (b *Backend) copyBandwidth(size int64, iters int) (float64, error) {
	src, err := cu.MemAlloc(size)
	if err != nil {
		return 0, err
	}
	defer cu.MemFree(src)
	dst, err := cu.MemAlloc(size)
	if err != nil {
		return 0, err
	}
	defer cu.MemFree(dst)
	if err := b.launch("quest_fill_f32", [3]int{4096, 1, 1}, 256, 0, u(src), uint64(size/4), 7); err != nil {
		return 0, err
	}
	t, err := newTimer()
	if err != nil {
		return 0, err
	}
	defer t.destroy()
	us, err := t.median(iters, func() error { return cu.MemcpyDtoDAsync(dst, src, size, cu.Stream{}) })
	if err != nil {
		return 0, err
	}
	return 2 * float64(size) / us / 1e3, nil
}

func (b *Backend) benchOne(cfg BenchConfig, n, batch int, copyGBps float64) ([]BenchResult, error) {
	s, d, kvh, hq := cfg.PageSize, cfg.HeadDim, cfg.KVHeads, cfg.QHeads
	dt := cfg.DType
	if dt == plan.FP8 {
		// The kernel benchmark fills pages with quest_fill_*; fp8 records
		// are written by appends (questctl bench decode times them).
		return nil, fmt.Errorf("cuda bench: %w: fp8 K/V pages (use bench decode)", kernels.ErrUnsupportedDType)
	}
	P := (n + s - 1) / s
	pages := P * batch
	kvBytes := int64(pages) * int64(kvh*s*d*dt.Bytes())
	if 2*kvBytes > cfg.MaxBytes {
		return nil, nil
	}
	l := &DeviceLayer{Pages: pages, KVHeads: kvh, HeadDim: d, PageSize: s, DType: dt}
	if err := b.allocLayer(l); err != nil {
		return nil, err
	}
	defer func() { cu.MemFree(l.K); cu.MemFree(l.V); cu.MemFree(l.Summary); freeFP8(l) }()
	if err := b.allocFP8(l); err != nil { // Config.SummaryDType fp8: score from an fp8 copy
		return nil, err
	}
	elems := int64(pages) * int64(kvh*s*d)
	fill := "quest_fill_" + dt.String()
	if err := b.launch(fill, [3]int{8192, 1, 1}, 256, 0, u(l.K), uint64(elems), 1); err != nil {
		return nil, err
	}
	if err := b.launch(fill, [3]int{8192, 1, 1}, 256, 0, u(l.V), uint64(elems), 2); err != nil {
		return nil, err
	}
	if err := b.launch("quest_summarize_"+dt.String(), [3]int{pages, kvh, 1}, min(d, 256), 0, u(l.K), u(l.Summary), uint64(kvh), uint64(d), uint64(s), uint64(s)); err != nil {
		return nil, err
	}
	if err := b.encodeFP8(l, 0, 0, pages); err != nil {
		return nil, err
	}
	// Batch CSR: identity page tables, full last pages.
	indptr := make([]int32, batch+1)
	table := make([]int32, pages)
	last := make([]int32, batch)
	for i := range batch {
		indptr[i+1] = int32((i + 1) * P)
		last[i] = int32(n - (P-1)*s)
	}
	for i := range pages {
		table[i] = int32(i)
	}
	q := make([]float32, batch*hq*d)
	for i := range q {
		q[i] = float32((i*7919)%13)/6 - 1
	}
	pInd, err := upload(b, "bench.indptr", indptr)
	if err != nil {
		return nil, err
	}
	pTab, err := upload(b, "bench.table", table)
	if err != nil {
		return nil, err
	}
	pLast, err := upload(b, "bench.last", last)
	if err != nil {
		return nil, err
	}
	pQ, err := upload(b, "bench.q", q)
	if err != nil {
		return nil, err
	}
	rows := batch * kvh
	pScores, err := b.buf("bench.scores", int64(pages*kvh)*4)
	if err != nil {
		return nil, err
	}
	t, err := newTimer()
	if err != nil {
		return nil, err
	}
	defer t.destroy()
	shape := kernels.Shape{QHeads: hq, KVHeads: kvh, HeadDim: d, PageSize: s}
	// attendPlan uploads items for lists of k pages per row at row*k.
	type plan struct {
		items, maxItems                int
		seq, row, lo, hi, rowItem, lst cu.DevicePtr
	}
	mkPlan := func(name string, k int, lists []int32) (plan, error) {
		var iSeq, iRow, iLo, iHi, rowItem []int32
		chunkA := int32(b.chunkFor(shape, dt, rows*k))
		for r := range rows {
			rowItem = append(rowItem, int32(len(iSeq)))
			for p := int32(r * k); p < int32((r+1)*k); p += chunkA {
				iSeq = append(iSeq, int32(r/kvh))
				iRow = append(iRow, int32(r%kvh))
				iLo = append(iLo, p)
				iHi = append(iHi, min(p+chunkA, int32((r+1)*k)))
			}
		}
		rowItem = append(rowItem, int32(len(iSeq)))
		pl := plan{items: len(iSeq), maxItems: (k + int(chunkA) - 1) / int(chunkA)}
		var err error
		for i, a := range []struct {
			dst *cu.DevicePtr
			src []int32
		}{{&pl.seq, iSeq}, {&pl.row, iRow}, {&pl.lo, iLo}, {&pl.hi, iHi}, {&pl.rowItem, rowItem}} {
			if *a.dst, err = upload(b, fmt.Sprintf("%s.%d", name, i), a.src); err != nil {
				return pl, err
			}
		}
		if lists != nil {
			if pl.lst, err = upload(b, name+".lists", lists); err != nil {
				return pl, err
			}
		}
		return pl, nil
	}
	heads := hq / kvh
	pO, err := b.buf("bench.o", int64(batch*hq*d)*4)
	if err != nil {
		return nil, err
	}
	pL, err := b.buf("bench.lse", int64(batch*hq)*4)
	if err != nil {
		return nil, err
	}
	attendMode := func(pl plan, lists cu.DevicePtr, pdl bool) error {
		return b.launchAttendReduce(l, shape, heads, 0, attendArgs{
			ind: pInd, pg: pTab, last: pLast, q: pQ, iSeq: pl.seq, iRow: pl.row, iLo: pl.lo, iHi: pl.hi, lists: lists,
			rowItem: pl.rowItem, o: pO, lse: pL, items: pl.items, nrows: rows, minItemsPerRow: pl.maxItems, maxItemsPerRow: pl.maxItems,
		}, pdl)
	}
	attend := func(pl plan, lists cu.DevicePtr) error { return attendMode(pl, lists, false) }
	// Dense: every page of every row.
	dense := make([]int32, 0, rows*P)
	for range rows {
		for p := range P {
			dense = append(dense, int32(p))
		}
	}
	dplan, err := mkPlan("bench.dense", P, dense)
	if err != nil {
		return nil, err
	}
	denseUS, err := b.cold(cfg.Iters, func() error { return attend(dplan, dplan.lst) })
	if err != nil {
		return nil, err
	}
	bytesDense := int64(batch) * int64(P) * int64(kvh*s*d*dt.Bytes()) * 2
	pTmax, err := b.buf("bench.tmax", int64(pages*kvh)*4)
	if err != nil {
		return nil, err
	}
	var haveTmax bool
	score := func() error {
		var err error
		haveTmax, err = b.launchScore(l, shape, batch, P, pInd, pTab, pQ, pScores, pTmax, 0)
		return err
	}
	scoreUS, err := b.cold(cfg.Iters, score)
	if err != nil {
		return nil, err
	}
	sumBytes := int64(batch) * int64(P) * int64(kvh*2*d*dt.Bytes())
	if l.FP8 != nil {
		sumBytes = int64(batch) * int64(P) * int64(kvh*(2*d+4)) // codes and a scale per record
	}
	var out []BenchResult
	for _, budget := range cfg.Budgets {
		k := budget / s
		if k >= P || k < 2 {
			continue // dense is exact there; nothing to rank
		}
		// Lists: row r owns [r*k, (r+1)*k): top-K writes k-1 ranked pages,
		// the last slot holds the tail page.
		lists := make([]int32, rows*k)
		for r := range rows {
			lists[r*k+k-1] = int32(P - 1)
		}
		qplan, err := mkPlan(fmt.Sprintf("bench.quest%d", k), k, lists)
		if err != nil {
			return nil, err
		}
		var soff, nn, base, kk, ooff []int32
		for r := range rows {
			seq, h := r/kvh, r%kvh
			soff = append(soff, int32(seq*P*kvh+h*P))
			nn = append(nn, int32(P-1))
			base = append(base, 0)
			kk = append(kk, int32(k-1))
			ooff = append(ooff, int32(r*k))
		}
		var tp [5]cu.DevicePtr
		for i, a := range [][]int32{soff, nn, base, kk, ooff} {
			if tp[i], err = upload(b, fmt.Sprintf("bench.topk%d", i), a); err != nil {
				return nil, err
			}
		}
		tplan := &kernels.TopKPlan{ScoreOff: soff, N: nn, Base: base, K: kk, OutOff: ooff}
		tm := cu.DevicePtr(0)
		if haveTmax {
			tm = pTmax // rows start at score row starts: seq*P*kvh + h*P
		}
		topkMode := func(pdl bool) error { return b.launchTopK(tplan, pScores, tm, tp, qplan.lst, pdl) }
		topk := func() error { return topkMode(false) }
		topkUS, err := b.cold(cfg.Iters, topk)
		if err != nil {
			return nil, err
		}
		topkStepUS, err := b.coldAfter(cfg.Iters, score, topk)
		if err != nil {
			return nil, err
		}
		attUS, err := b.cold(cfg.Iters, func() error { return attend(qplan, qplan.lst) })
		if err != nil {
			return nil, err
		}
		// The step launches top-K and attention as programmatic dependents
		// (each overlaps the previous kernel's drain; see launchMode).
		step := func() error {
			if err := score(); err != nil {
				return err
			}
			if err := topkMode(true); err != nil {
				return err
			}
			return attendMode(qplan, qplan.lst, true)
		}
		questUS, err := b.cold(cfg.Iters, step)
		if err != nil {
			return nil, err
		}
		latUS, err := t.median(cfg.Iters, step)
		if err != nil {
			return nil, err
		}
		servedUS, queuedUS, err := b.benchServed(cfg.Iters, shape, l, indptr, last, pTab, P, q, tplan, k, lists)
		if err != nil {
			return nil, err
		}
		selBytes := int64(rows) * int64(k) * int64(s*d*dt.Bytes()) * 2
		r := BenchResult{
			Backend: "cuda", DType: dt.String(), Context: n, Batch: batch, Budget: budget, PageSize: s,
			QHeads: hq, KVHeads: kvh, HeadDim: d, SummaryDType: fp8Name(l),
			DenseUS: denseUS, QuestUS: questUS, QuestLatencyUS: latUS, ServedUS: servedUS, ServedQueuedUS: queuedUS, ScoreUS: scoreUS, TopKUS: topkUS, TopKStepUS: topkStepUS, AttendUS: attUS,
			Speedup:   denseUS / questUS,
			BytesRead: sumBytes + selBytes, BytesDense: bytesDense,
			RhoFormula: 1/float64(s) + float64(k)/float64(P),
			DenseGBps:  float64(bytesDense) / denseUS / 1e3,
			ScoreGBps:  float64(sumBytes) / scoreUS / 1e3,
			AttendGBps: float64(selBytes) / attUS / 1e3,
			CopyGBps:   copyGBps,
			Iters:      cfg.Iters,
		}
		r.RooflineDenseUS = float64(bytesDense) / copyGBps / 1e3
		r.RooflineQuestUS = float64(r.BytesRead) / copyGBps / 1e3
		r.DenseOfCopy = r.DenseGBps / copyGBps
		out = append(out, r)
	}
	if len(out) == 0 {
		out = append(out, BenchResult{Backend: "cuda", DType: dt.String(), Context: n, Batch: batch, PageSize: s, QHeads: hq, KVHeads: kvh, HeadDim: d,
			DenseUS: denseUS, BytesDense: bytesDense, DenseGBps: float64(bytesDense) / denseUS / 1e3, CopyGBps: copyGBps,
			RooflineDenseUS: float64(bytesDense) / copyGBps / 1e3, DenseOfCopy: float64(bytesDense) / denseUS / 1e3 / copyGBps, Iters: cfg.Iters})
	}
	return out, nil
}

// servedQueue is the number of queued steps per Sync in benchServed (the
// layers of a Llama-3.1-8B decode step).
const servedQueue = 32

// benchServed times the step through Backend.Step's own path (checks,
// packing, upload, kernels, download; device goroutine only): the batch
// reads device page tables that point into the bench's identity table at
// tab (P entries per sequence), every row ranks its sequence's P-1 first
// pages for k-1 slots and attends the tail page too, as the bench's
// kernel-level step does. It returns the synchronous step's median wall
// time from a cold L2 and the queued step's wall time per call (see
// BenchResult).
func (b *Backend) benchServed(iters int, shape kernels.Shape, l *DeviceLayer, indptr, last []int32, tab cu.DevicePtr, P int, q []float32,
	tplan *kernels.TopKPlan, k int, lists []int32) (served, queued float64, err error) {
	n := len(last)
	ts := &deviceTables{m: map[uint64]*devTable{}, maxPage: l.Pages}
	seqs := make([]uint64, n)
	for i := range n {
		seqs[i] = uint64(i)
		ts.m[uint64(i)] = &devTable{ptr: tab + cu.DevicePtr(4*i*P), n: P, cap: P} // not owned: never freed
	}
	bt := &kernels.Batch{Indptr: indptr, LastLen: last, Tables: &kernels.DeviceTables{Set: ts, Seqs: seqs}}
	rows := n * shape.KVHeads
	ls := &kernels.Lists{Mode: kernels.GroupMax, Indptr: make([]int32, rows+1)}
	for r := range rows {
		ls.Indptr[r+1] = int32((r + 1) * k)
	}
	ls.Pages = slices.Clone(lists)
	o, lse := make([]float32, n*shape.QHeads*shape.HeadDim), make([]float32, n*shape.QHeads)
	lay := kernels.Layer{Device: l}
	call := func(queue bool) error {
		b.stepMu.Lock()
		defer b.stepMu.Unlock()
		for r := range rows {
			ls.Pages[r*k+k-1] = int32(P - 1) // the top-K wrote the rest
		}
		if err := b.checkStep(shape, lay, bt, q, tplan, ls, o, lse); err != nil {
			return err
		}
		return b.stepDevice(queue, shape, lay, bt, q, tplan, ls, o, lse, nil)
	}
	flush, err := b.buf("bench.flush", l2Flush)
	if err != nil {
		return 0, 0, err
	}
	if err := call(false); err != nil { // warm-up
		return 0, 0, err
	}
	xs := make([]float64, iters)
	for i := range xs {
		if err := cu.MemsetD32Async(flush, uint(i), l2Flush/4, cu.Stream{}); err != nil {
			return 0, 0, err
		}
		if err := cu.Synchronize(); err != nil {
			return 0, 0, err
		}
		t0 := time.Now()
		if err := call(false); err != nil {
			return 0, 0, err
		}
		xs[i] = float64(time.Since(t0).Nanoseconds()) / 1e3
	}
	slices.Sort(xs)
	served = xs[len(xs)/2]
	t0 := time.Now()
	for range servedQueue {
		if err := call(true); err != nil {
			return 0, 0, err
		}
	}
	if err := cu.Synchronize(); err != nil {
		return 0, 0, err
	}
	b.settle()
	queued = float64(time.Since(t0).Nanoseconds()) / 1e3 / servedQueue
	return served, queued, nil
}
