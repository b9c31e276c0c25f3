package backendtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// FakeDevice is a CPU backend with a pretend device, for testing the code
// that keeps pages in device memory without a GPU: its pools are separate
// host arrays changed only through the kernels.DeviceStore methods, and
// its kernels, given a Layer.Device, read only those. A page operation
// routed to the wrong place shows up as a wrong result. The page
// operations are written here, independently of the page store's.
//
// DType is the pools' storage type: plan.Float32 (the zero value) or
// plan.FP8, whose pools hold fp8 K/V records (E4M3 codes and a scale per
// (page, KV head) record, summaries float32 over the dequantized keys:
// kernels/fp8 "KV records", fakefp8.go), as the CUDA backend's do.
type FakeDevice struct {
	*kernels.CPU
	DType plan.DType
}

var (
	_ kernels.Backend     = FakeDevice{}
	_ kernels.DeviceStore = FakeDevice{}
	_ kernels.Stepper     = FakeDevice{}
	_ kernels.Ranker      = FakeDevice{}
	_ kernels.SlotStore   = FakeDevice{}
)

// FakePool is one pretend device pool (a FakeDevice's Layer.Device).
// slots > 0 makes it a slot pool (kernels.SlotStore): K/V of slots slots,
// summaries of every page. K/V are float32 (Layer.K, V) or fp8 records
// (Layer.K8, V8, KScale, VScale).
type FakePool struct {
	kernels.Layer
	kvh, d, s int
	slots     int
}

func fakePool(pool any) (*FakePool, error) {
	p, ok := pool.(*FakePool)
	if !ok || p.Summary == nil {
		return nil, fmt.Errorf("fake device: pool %T is not a live *FakePool", pool)
	}
	return p, nil
}

// NewPool implements kernels.DeviceStore.
func (f FakeDevice) NewPool(_ context.Context, pages, kvh, d, s int) (any, error) {
	return f.newPool(pages, pages, kvh, d, s, 0)
}

// newPool makes a pool of f's type with K/V of kvPages pages (slots > 0:
// a slot pool of that many slots) and summaries of pages pages.
func (f FakeDevice) newPool(pages, kvPages, kvh, d, s, slots int) (*FakePool, error) {
	n := kvPages * kvh * s * d
	l := kernels.Layer{Summary: make([]float32, pages*kvh*2*d)}
	switch f.DType {
	case plan.Float32:
		l.K, l.V = make([]float32, n), make([]float32, n)
	case plan.FP8:
		l.K8, l.V8 = make([]uint8, n), make([]uint8, n)
		l.KScale, l.VScale = make([]float32, kvPages*kvh), make([]float32, kvPages*kvh)
	default:
		return nil, fmt.Errorf("fake device: %w: %v pools (float32 and fp8 only)", kernels.ErrUnsupportedDType, f.DType)
	}
	return &FakePool{l, kvh, d, s, slots}, nil
}

// FreePool implements kernels.DeviceStore.
func (FakeDevice) FreePool(_ context.Context, pool any) error {
	p, err := fakePool(pool)
	if err != nil {
		return err
	}
	p.Layer = kernels.Layer{}
	return nil
}

func (p *FakePool) page(pg int32) error {
	if pg < 0 || int(pg)*p.kvh*2*p.d >= len(p.Summary) {
		return fmt.Errorf("fake device: page %d outside the pool", pg)
	}
	return nil
}

// WriteTokens implements kernels.DeviceStore.
func (FakeDevice) WriteTokens(_ context.Context, pool any, pages []int32, slot int, k, v []float32) error {
	p, err := fakePool(pool)
	if err != nil {
		return err
	}
	if p.slots > 0 {
		return errSlotPool
	}
	return p.write(pages, pages, p.page, slot, k, v)
}

// write stores the tokens k, v from slot slot of pages[0] on, the K/V of
// pages[i] at index kv[i] (checked by kvOK: the page itself, or its slot
// in a slot pool), and widens the pages' summaries.
func (p *FakePool) write(pages, kv []int32, kvOK func(int32) error, slot int, k, v []float32) error {
	tok := p.kvh * p.d
	if len(k) != len(v) || len(k)%tok != 0 || (slot+len(k)/tok+p.s-1)/p.s != len(pages) || len(kv) != len(pages) {
		return errors.New("fake device: tokens do not fit the pages")
	}
	if p.FP8() {
		return p.write8(pages, kv, kvOK, slot, k, v)
	}
	for t := range len(k) / tok {
		i, sl := (slot+t)/p.s, (slot+t)%p.s
		pg, ks := pages[i], kv[i]
		if err := errors.Join(p.page(pg), kvOK(ks)); err != nil {
			return err
		}
		for h := range p.kvh {
			rec := p.Summary[(int(pg)*p.kvh+h)*2*p.d:][:2*p.d]
			for j := range p.d {
				x := k[t*tok+h*p.d+j]
				dst := ((int(ks)*p.kvh+h)*p.s+sl)*p.d + j
				p.K[dst], p.V[dst] = x, v[t*tok+h*p.d+j]
				if sl == 0 {
					rec[j], rec[p.d+j] = x, x
				}
				rec[j], rec[p.d+j] = min(rec[j], x), max(rec[p.d+j], x)
			}
		}
	}
	return nil
}

// Rescan implements kernels.DeviceStore (on a slot pool with valid 0
// only: it empties the pages' summaries).
func (FakeDevice) Rescan(_ context.Context, pool any, pages []int32, valid int) error {
	p, err := fakePool(pool)
	if err != nil {
		return err
	}
	if p.slots > 0 && valid > 0 {
		return errSlotPool // valid 0 resets summaries, which a slot pool indexes by page
	}
	for _, pg := range pages {
		if err := p.page(pg); err != nil {
			return err
		}
		p.rescan(pg, pg, valid)
	}
	return nil
}

// rescan sets the summaries of page pg to the box of the first valid
// keys stored at K/V index kv (the page itself, or its slot in a slot
// pool; fp8 records: their dequantized keys).
func (p *FakePool) rescan(pg, kv int32, valid int) {
	for h := range p.kvh {
		rec := p.Summary[(int(pg)*p.kvh+h)*2*p.d:][:2*p.d]
		for j := range p.d {
			rec[j], rec[p.d+j] = float32(math.Inf(1)), float32(math.Inf(-1))
			for r := range valid {
				x := p.key(kv, h, r, j)
				rec[j], rec[p.d+j] = min(rec[j], x), max(rec[p.d+j], x)
			}
		}
	}
}

// CopyPage implements kernels.DeviceStore.
func (FakeDevice) CopyPage(_ context.Context, pool any, dst, src int32) error {
	p, err := fakePool(pool)
	if err != nil {
		return err
	}
	if p.slots > 0 {
		return errSlotPool
	}
	if err := errors.Join(p.page(dst), p.page(src)); err != nil {
		return err
	}
	p.copyKV(dst, src)
	sum := p.kvh * 2 * p.d
	copy(p.Summary[int(dst)*sum:][:sum], p.Summary[int(src)*sum:])
	return nil
}

// ReadPages implements kernels.DeviceStore. Of a slot pool it returns the
// summaries only (K and V nil): its K/V are addressed by slot
// (ReadSlotKV).
func (FakeDevice) ReadPages(_ context.Context, pool any, pages []int32) (kernels.Layer, error) {
	p, err := fakePool(pool)
	if err != nil {
		return kernels.Layer{}, err
	}
	sum := p.kvh * 2 * p.d
	var out kernels.Layer
	for _, pg := range pages {
		if err := p.page(pg); err != nil {
			return kernels.Layer{}, err
		}
		if p.slots == 0 {
			k, v := p.readKV(pg)
			out.K, out.V = append(out.K, k...), append(out.V, v...)
		}
		out.Summary = append(out.Summary, p.Summary[int(pg)*sum:][:sum]...)
	}
	return out, nil
}

// fakeTables is a pretend device table set.
type fakeTables struct {
	mu sync.Mutex
	m  map[uint64][]int32
}

// NewTables implements kernels.DeviceStore.
func (FakeDevice) NewTables(context.Context) (any, error) {
	return &fakeTables{m: map[uint64][]int32{}}, nil
}

// FreeTables implements kernels.DeviceStore.
func (FakeDevice) FreeTables(_ context.Context, set any) error {
	ts, ok := set.(*fakeTables)
	if !ok {
		return fmt.Errorf("fake device: table set %T", set)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.m = nil
	return nil
}

// WriteTable implements kernels.DeviceStore.
func (FakeDevice) WriteTable(_ context.Context, set any, seq uint64, at int, pages []int32, n, maxPage int) error {
	ts, ok := set.(*fakeTables)
	if !ok {
		return fmt.Errorf("fake device: table set %T", set)
	}
	if at < 0 || n < at+len(pages) {
		return fmt.Errorf("fake device: table write [%d,+%d) beyond length %d", at, len(pages), n)
	}
	for _, p := range pages {
		if p < 0 || int(p) >= maxPage {
			return fmt.Errorf("fake device: page %d outside 0..%d", p, maxPage-1)
		}
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.m[seq]
	if at > len(t) || n > max(len(t), at+len(pages)) {
		return fmt.Errorf("fake device: table write of %d entries from %d, length %d, leaves entries unwritten (table of %d)", len(pages), at, n, len(t))
	}
	for len(t) < n {
		t = append(t, -1)
	}
	t = t[:n]
	copy(t[at:], pages)
	ts.m[seq] = t
	return nil
}

// DropTable implements kernels.DeviceStore.
func (FakeDevice) DropTable(_ context.Context, set any, seq uint64) error {
	ts, ok := set.(*fakeTables)
	if !ok {
		return fmt.Errorf("fake device: table set %T", set)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	delete(ts.m, seq)
	return nil
}

// batch resolves device tables into host page lists for the CPU kernels.
func (f FakeDevice) batch(b *kernels.Batch) (*kernels.Batch, error) {
	if b.Tables == nil {
		return b, nil
	}
	ts, ok := b.Tables.Set.(*fakeTables)
	if !ok || len(b.Tables.Seqs) != b.Len() {
		return nil, errors.New("fake device: bad device tables")
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	c := &kernels.Batch{Indptr: b.Indptr, LastLen: b.LastLen, Pages: make([]int32, 0, b.Total())}
	for i, id := range b.Tables.Seqs {
		t := ts.m[id]
		if len(t) < b.NumPages(i) {
			return nil, fmt.Errorf("fake device: sequence %d has %d table entries, the batch reads %d", id, len(t), b.NumPages(i))
		}
		c.Pages = append(c.Pages, t[:b.NumPages(i)]...)
	}
	return c, nil
}

// dev resolves a call's layer: the pretend device pool when one is given.
// A slot pool reads as a pool of its slots for attention (summaries cut
// to as many pages: attention reads none) and as summaries only for
// scoring.
func (f FakeDevice) dev(l kernels.Layer, withKV bool) kernels.Layer {
	if p, ok := l.Device.(*FakePool); ok {
		if p.slots == 0 {
			return p.Layer
		}
		if withKV {
			l := p.Layer
			l.Summary = l.Summary[:p.slots*p.kvh*2*p.d]
			return l
		}
		return kernels.Layer{Summary: p.Summary}
	}
	return l
}

// Score runs the CPU kernel on the pretend device pool and tables.
func (f FakeDevice) Score(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, mode kernels.GQAMode, out []float32) error {
	b, err := f.batch(b)
	if err != nil {
		return err
	}
	return f.CPU.Score(ctx, s, f.dev(l, false), b, q, mode, out)
}

// Attend runs the CPU kernel on the pretend device pool and tables (a
// slot pool with Layer.Slots: through its page -> slot table).
func (f FakeDevice) Attend(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, lists *kernels.Lists, o, lse []float32) error {
	return f.attend(ctx, s, l, b, q, lists, o, lse, false)
}

// attend is Attend; stamp writes the use stamps of a slot table (Step).
func (f FakeDevice) attend(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, lists *kernels.Lists, o, lse []float32, stamp bool) error {
	b, err := f.batch(b)
	if err != nil {
		return err
	}
	p, _ := l.Device.(*FakePool)
	if err := kernels.CheckSlotUse(l, p != nil && p.slots > 0); err != nil {
		return err
	}
	if l.Slots != nil {
		if _, err := lists.Check(b, s.Rows(lists.Mode), nil); err != nil {
			return err
		}
		if b, err = f.bySlot(l, b, s.Rows(lists.Mode), lists, stamp); err != nil {
			return err
		}
	}
	return f.CPU.Attend(ctx, s, f.dev(l, true), b, q, lists, o, lse)
}

// Step implements kernels.Stepper as Score, TopK and Attend on the pretend
// device (the embedded CPU's Step would read the host arrays). On a slot
// pool with Layer.Slots it stamps the attended pages' use entries.
func (f FakeDevice) Step(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error {
	var c kernels.StepCheck
	if err := c.Check(b, s.Rows(lists.Mode), plan, lists); err != nil {
		return err
	}
	if l.Slots == nil {
		_, err := kernels.Compose(ctx, f, nil, s, l, b, q, plan, lists, o, lse)
		return err
	}
	if plan.Rows() > 0 {
		scores := make([]float32, b.Total()*s.Rows(lists.Mode))
		if err := f.Score(ctx, s, l, b, q, lists.Mode, scores); err != nil {
			return err
		}
		if err := f.TopK(ctx, scores, plan, lists.Pages); err != nil {
			return err
		}
	}
	return f.attend(ctx, s, l, b, q, lists, o, lse, true)
}

// Rank implements kernels.Ranker as Score and TopK on the pretend device.
func (f FakeDevice) Rank(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, mode kernels.GQAMode, plan *kernels.TopKPlan, out []int32, outScores []float32) error {
	_, err := kernels.ComposeRank(ctx, f, nil, s, l, b, q, mode, plan, out, outScores)
	return err
}
