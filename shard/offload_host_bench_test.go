package shard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// BenchmarkOffloadHost measures the host side of a DeviceResident
// offload layer-step at the shape of issue 26: one sequence of 1M tokens
// (65,536 pages of 16), 32 query and 8 KV heads, D = 128, bf16 pools,
// B = 4096 tokens (K = 256 pages per KV head, group_max), one layer, with
// 10% and 100% of the pages' K/V on the device. The device is nopDevice:
// it stores nothing and computes nothing, and its Rank returns a
// selection that drifts slowly (about 15 of each row's 255 ranked pages
// change per step, so ~94% of the selected pages hit at 10%), so the
// time per op is the shard's and the store's bookkeeping alone: the
// page table, the recall (residency, eviction, LRU), the working set and
// the compaction of the attended batch. It reports the hit rate, the
// misses and the pages attended per step.
func BenchmarkOffloadHost(b *testing.B) {
	for _, pct := range []int{100, 10} {
		b.Run(fmt.Sprintf("budget=%d%%", pct), func(b *testing.B) { benchOffloadHost(b, pct) })
	}
}

func benchOffloadHost(b *testing.B, pct int) {
	const qh, kvh, d, s, tokens, budgetTok = 32, 8, 128, 16, 1 << 20, 4096
	pages := tokens / s
	dev := &nopDevice{drift: 17}
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = s, budgetTok, 0
	st := pagestore.Config{Layers: 1, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s},
		Capacity: pages + 8, DeviceBudget: pct * pages / 100, MemoryLimit: -1}
	sh, err := New(Config{Store: st, Policy: pol, DeviceResident: true}, dev)
	if err != nil {
		b.Fatal(err)
	}
	defer sh.Close()
	id := sh.Store().Create()
	const chunk = 4096
	kv := make([]float32, chunk*kvh*d)
	for range tokens / chunk {
		if err := sh.Append(id, 0, kv, kv); err != nil {
			b.Fatal(err)
		}
	}
	q := make([]float32, qh*d)
	var res StepResult
	reqs := []SeqStep{{Seq: id, Q: q}}
	step := func(t int) {
		q[0] = float32(t) // the nopDevice's clock: its selection at step t
		if err := sh.Step(context.Background(), 0, reqs, StepOptions{}, &res); err != nil {
			b.Fatal(err)
		}
	}
	for t := range 64 { // fill the device pool with the selection's history
		step(t)
	}
	dev.precompute(64, 64+b.N) // the device's work, out of the timing
	before := sh.OffloadStats()
	attended := dev.attended
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for i := range b.N {
		step(64 + i)
	}
	b.StopTimer()
	// The process's CPU time: on a loaded machine (other processes
	// taking the cores) steadier than the wall time; nothing else of
	// the process runs meanwhile (nopDevice starts no goroutine).
	b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	after := sh.OffloadStats()
	n := float64(b.N)
	hits, misses := after.Hits-before.Hits, after.Misses-before.Misses
	b.ReportMetric(float64(hits)/float64(max(hits+misses, 1)), "hit-rate")
	b.ReportMetric(float64(misses)/n, "misses/step")
	b.ReportMetric(float64(dev.attended-attended)/n, "attended/step")
	b.ReportMetric(float64((after.Stall-before.Stall).Nanoseconds())/n, "recall-ns/step")
}

// cpuTime returns the CPU time (user and system) of the process so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nopDevice is a kernels.SlotStore and kernels.Ranker that stores and
// computes nothing: a device whose work costs no host time, so that a
// benchmark over it times the host bookkeeping of offload alone. Its
// Rank picks, for plan row r at step t (the batch's first query element),
// K pages of the row's candidates: candidate j of K is a hash of (r, j,
// the epoch of j at t), and j's epoch turns every drift steps, a different
// step for each j, so K/drift of a row's pages change per step
// (precompute computes them ahead, outside a benchmark's timer). Attend
// counts the pages listed. One goroutine uses it (the shard's lock).
type nopDevice struct {
	drift    int
	attended int64
	mark     []uint32 // Rank: candidate page (relative to Base) -> epoch when taken
	ep       uint32
	plan     kernels.TopKPlan   // the last Rank's plan
	sel      map[uint64][]int32 // step -> Rank's out under plan
}

var (
	_ kernels.SlotStore = (*nopDevice)(nil)
	_ kernels.Ranker    = (*nopDevice)(nil)
)

var errNop = errors.New("nop device: not implemented")

func (*nopDevice) Name() string { return "nop" }
func (*nopDevice) Score(context.Context, kernels.Shape, kernels.Layer, *kernels.Batch, []float32, kernels.GQAMode, []float32) error {
	return errNop
}
func (*nopDevice) TopK(context.Context, []float32, *kernels.TopKPlan, []int32) error { return errNop }
func (*nopDevice) Merge(context.Context, int, []float32, []float32, []float32, []float32) error {
	return errNop
}
func (*nopDevice) Close() error { return nil }

func (d *nopDevice) Attend(_ context.Context, _ kernels.Shape, _ kernels.Layer, b *kernels.Batch, _ []float32, lists *kernels.Lists, o, lse []float32) error {
	if lists.All {
		d.attended += int64(b.Total())
	} else {
		d.attended += int64(len(lists.Pages))
	}
	clear(o)
	clear(lse)
	return nil
}

// splitmix is a 64-bit mixing function (SplitMix64's finalizer).
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (d *nopDevice) Rank(_ context.Context, _ kernels.Shape, _ kernels.Layer, _ *kernels.Batch, q []float32, _ kernels.GQAMode, p *kernels.TopKPlan, out []int32, outScores []float32) error {
	t := uint64(q[0])
	if !slices.Equal(p.N, d.plan.N) || !slices.Equal(p.K, d.plan.K) || !slices.Equal(p.Base, d.plan.Base) || !slices.Equal(p.OutOff, d.plan.OutOff) {
		d.plan.N, d.plan.K = slices.Clone(p.N), slices.Clone(p.K)
		d.plan.Base, d.plan.OutOff = slices.Clone(p.Base), slices.Clone(p.OutOff)
		d.sel = nil // another plan: other selections
	}
	sel, ok := d.sel[t]
	if !ok {
		sel = d.selection(t, len(out))
	}
	copy(out, sel)
	for j := range outScores {
		outScores[j] = 1
	}
	return nil
}

// precompute computes the selections of steps [t0, t1) of the last plan.
func (d *nopDevice) precompute(t0, t1 int) {
	n := 0
	for r := range d.plan.N {
		n = max(n, int(d.plan.OutOff[r])+int(min(d.plan.K[r], d.plan.N[r])))
	}
	if d.sel == nil {
		d.sel = map[uint64][]int32{}
	}
	for t := t0; t < t1; t++ {
		d.sel[uint64(t)] = d.selection(uint64(t), n)
	}
}

// selection returns the out array (n entries) of the plan's rows at step t.
func (d *nopDevice) selection(t uint64, n int) []int32 {
	out := make([]int32, n)
	p := &d.plan
	for r := range p.N {
		n, k, base, off := int(p.N[r]), int(p.K[r]), p.Base[r], int(p.OutOff[r])
		if k <= 0 || n <= 0 {
			continue
		}
		k = min(k, n)
		if len(d.mark) < n {
			d.mark = make([]uint32, n)
		}
		d.ep++
		if d.ep == 0 {
			clear(d.mark)
			d.ep = 1
		}
		pick := out[off : off+k]
		for j := range k {
			epoch := (t + uint64(j)) / uint64(d.drift)
			c := int(splitmix(uint64(r)<<48^uint64(j)<<32^epoch) % uint64(n))
			for d.mark[c] == d.ep { // taken: the next free candidate
				c = (c + 1) % n
			}
			d.mark[c] = d.ep
			pick[j] = base + int32(c)
		}
		slices.Sort(pick)
	}
	return out
}

// nopPool is a slot pool or table set of the nopDevice: it holds nothing.
type nopPool struct{}

func (*nopDevice) PoolDType() plan.DType { return plan.BFloat16 }
func (*nopDevice) NewPool(context.Context, int, int, int, int) (any, error) {
	return nil, errNop
}
func (*nopDevice) FreePool(context.Context, any) error { return nil }
func (*nopDevice) WriteTokens(context.Context, any, []int32, int, []float32, []float32) error {
	return errNop
}
func (*nopDevice) Rescan(context.Context, any, []int32, int) error   { return nil }
func (*nopDevice) CopyPage(context.Context, any, int32, int32) error { return errNop }
func (*nopDevice) NewTables(context.Context) (any, error)            { return nopPool{}, nil }
func (*nopDevice) FreeTables(context.Context, any) error             { return nil }
func (*nopDevice) DropTable(context.Context, any, uint64) error      { return nil }
func (*nopDevice) ReadPages(context.Context, any, []int32) (kernels.Layer, error) {
	return kernels.Layer{}, errNop
}
func (*nopDevice) WriteTable(context.Context, any, uint64, int, []int32, int, int) error {
	return nil
}
func (*nopDevice) NewSlotPool(context.Context, int, int, int, int, int) (any, error) {
	return nopPool{}, nil
}
func (*nopDevice) WriteSlotTokens(context.Context, any, []int32, []int32, int, []float32, []float32) error {
	return nil
}
func (*nopDevice) RescanSlot(context.Context, any, int32, int32, int) error { return nil }
func (*nopDevice) CopySlot(context.Context, any, int32, int32, int32, int32) error {
	return nil
}
func (*nopDevice) MoveSlots(context.Context, []any, kernels.HostTier, []kernels.SlotMove, []kernels.SlotMove) error {
	return nil
}
func (*nopDevice) ReadSlotKV(context.Context, any, int32) ([]float32, []float32, error) {
	return nil, nil, errNop
}
func (*nopDevice) NewHostTier(_ context.Context, pages, payload int) (kernels.HostTier, error) {
	return nopTier{pages, payload}, nil
}

// nopTier is the nopDevice's host tier: it holds nothing.
type nopTier struct{ pages, payload int }

func (t nopTier) Slots() int                             { return t.pages }
func (t nopTier) PayloadBytes() int                      { return t.payload }
func (nopTier) Write(context.Context, int, []byte) error { return nil }
func (nopTier) Read(context.Context, int, []byte) error  { return errNop }
func (nopTier) Free(context.Context, int) error          { return nil }
func (nopTier) Close() error                             { return nil }
