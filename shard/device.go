package shard

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
)

// deviceData is the pagestore.PageData of a DeviceResident shard: one
// device pool per layer in a backend's memory, changed only by the
// backend's device operations.
type deviceData struct {
	ds     kernels.DeviceStore
	pools  []any // per layer
	tables any   // the device copy of the page tables (kernels.Batch.Tables)
	pages  int   // pool size
}

func (d *deviceData) Table(id pagestore.SeqID, at int, pages []int32, n int) error {
	return d.ds.WriteTable(context.Background(), d.tables, uint64(id), at, pages, n, d.pages)
}

func (d *deviceData) Drop(id pagestore.SeqID) error {
	return d.ds.DropTable(context.Background(), d.tables, uint64(id))
}

func (d *deviceData) Write(layer int, pages []int32, slot int, k, v []float32) error {
	return d.ds.WriteTokens(context.Background(), d.pools[layer], pages, slot, k, v)
}

func (d *deviceData) Reset(pages []int32) error {
	for l, p := range d.pools {
		if err := d.ds.Rescan(context.Background(), p, pages, 0); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil
}

func (d *deviceData) Copy(dst, src int32, _ []int) error {
	for l, p := range d.pools {
		if err := d.ds.CopyPage(context.Background(), p, dst, src); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil
}

func (d *deviceData) Rescan(page int32, valid int) error {
	one := []int32{page}
	for l, p := range d.pools {
		if err := d.ds.Rescan(context.Background(), p, one, valid); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil
}

// ReadPages returns float32 copies of the given physical pages of one
// layer (page i of the result is phys[i], in the kernels.Layer layout),
// wherever the pages live. For diagnostics and tests: it copies.
func (s *Shard) ReadPages(ctx context.Context, layer int, phys []int32) (kernels.Layer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readPages(ctx, layer, phys)
}

func (s *Shard) readPages(ctx context.Context, layer int, phys []int32) (kernels.Layer, error) {
	c := s.cfg.Store
	if layer < 0 || layer >= c.Layers {
		return kernels.Layer{}, fmt.Errorf("read pages: %w: layer %d outside 0..%d", ErrBadInput, layer, c.Layers-1)
	}
	for _, p := range phys {
		if p < 0 || int(p) >= c.Capacity {
			return kernels.Layer{}, fmt.Errorf("read pages: %w: page %d outside the pool of %d", ErrBadInput, p, c.Capacity)
		}
	}
	kv, sum := c.KVHeads*c.PageSize*c.HeadDim, c.KVHeads*2*c.HeadDim
	if s.dev != nil {
		l, err := s.ds.ReadPages(ctx, s.dev[layer], phys)
		if err != nil {
			return kernels.Layer{}, fmt.Errorf("read pages of layer %d: %w", layer, err)
		}
		if s.off != nil {
			// A slot pool gives the summaries; K/V live in a slot or
			// the tier.
			l.K, l.V = make([]float32, len(phys)*kv), make([]float32, len(phys)*kv)
			for i, p := range phys {
				if err := s.store.ReadKV(ctx, layer, p, l.K[i*kv:(i+1)*kv], l.V[i*kv:(i+1)*kv]); err != nil {
					return kernels.Layer{}, fmt.Errorf("read pages of layer %d: %w", layer, err)
				}
			}
		}
		s.readBack.Add(int64(len(l.K)+len(l.V)+len(l.Summary)) * 4)
		return l, nil
	}
	h := s.store.Layer(layer)
	if s.off != nil || h.K8 != nil {
		// K/V live in a device slot or the tier, or are fp8 records:
		// copy them page by page (ReadKV dequantizes fp8).
		out := kernels.Layer{K: make([]float32, len(phys)*kv), V: make([]float32, len(phys)*kv), Summary: make([]float32, 0, len(phys)*sum)}
		for i, p := range phys {
			if err := s.store.ReadKV(ctx, layer, p, out.K[i*kv:(i+1)*kv], out.V[i*kv:(i+1)*kv]); err != nil {
				return kernels.Layer{}, fmt.Errorf("read pages of layer %d: %w", layer, err)
			}
			out.Summary = append(out.Summary, h.Summary[int(p)*sum:][:sum]...)
		}
		s.readBack.Add(int64(len(phys)) * int64(2*kv+sum) * 4)
		return out, nil
	}
	out := kernels.Layer{K: make([]float32, 0, len(phys)*kv), V: make([]float32, 0, len(phys)*kv), Summary: make([]float32, 0, len(phys)*sum)}
	for _, p := range phys {
		out.K = append(out.K, h.K[int(p)*kv:][:kv]...)
		out.V = append(out.V, h.V[int(p)*kv:][:kv]...)
		out.Summary = append(out.Summary, h.Summary[int(p)*sum:][:sum]...)
	}
	s.readBack.Add(int64(len(phys)) * int64(2*kv+sum) * 4)
	return out, nil
}

// ReadBackBytes returns the bytes of page data (K, V and summaries, as
// float32) the shard has copied out of its page storage for host-side
// readers since it was made: [Shard.ReadPages], and the oracle selector
// and diagnostics on a DeviceResident or offloading shard. A
// host-resident shard's diagnostics read the pool in place and add
// nothing.
func (s *Shard) ReadBackBytes() int64 { return s.readBack.Load() }

// KeyChunkBytes bounds the keys a [PageKeys] reader of a DeviceResident
// (or offloading) shard holds at once; each chunk read also brings the chunk's values and
// summaries back (kernels.DeviceStore reads whole pages), so a chunk costs
// about twice this.
const KeyChunkBytes = 8 << 20

// PageKeys reads the keys of a list of physical pages of one layer for
// host-side reference code (diagnostics), page by page. On a host-resident
// shard [PageKeys.Keys] returns slices of the store's pool: no copy, no
// allocation. On a DeviceResident shard it copies the pages back a chunk
// of at most [KeyChunkBytes] of keys at a time, so memory stays bounded
// whatever the sequence's length; pages read in ascending order of their
// index in the list are read back once. An offloading shard's reader
// copies the same way, from the device pool or the tier (without bringing
// pages in).
//
// The caller keeps the pages from changing while it reads (no append,
// rollback or release of their sequences): the engine holds its lock
// across its diagnostics, the shard its own across a step's.
type PageKeys struct {
	s      *Shard
	layer  int
	phys   []int32
	blk    int       // floats of one page's keys: KVHeads x PageSize x HeadDim
	pool   []float32 // host-resident: the layer's K pool
	locked bool      // the caller holds s.mu (a step's diagnostics)
	lo, n  int       // DeviceResident: buf holds the keys of phys[lo:lo+n]
	buf    []float32
}

// PageKeys returns a reader of the keys of physical pages phys of layer
// (see [PageKeys]). It checks the layer and the page ids.
func (s *Shard) PageKeys(layer int, phys []int32) (*PageKeys, error) {
	return s.pageKeys(layer, phys, false)
}

func (s *Shard) pageKeys(layer int, phys []int32, locked bool) (*PageKeys, error) {
	c := s.cfg.Store
	if layer < 0 || layer >= c.Layers {
		return nil, fmt.Errorf("page keys: %w: layer %d outside 0..%d", ErrBadInput, layer, c.Layers-1)
	}
	for _, p := range phys {
		if p < 0 || int(p) >= c.Capacity {
			return nil, fmt.Errorf("page keys: %w: page %d outside the pool of %d", ErrBadInput, p, c.Capacity)
		}
	}
	k := &PageKeys{s: s, layer: layer, phys: phys, blk: c.KVHeads * c.PageSize * c.HeadDim, locked: locked}
	if s.dev == nil && s.off == nil {
		k.pool = s.store.Layer(layer).K // nil for fp8 records: read and dequantized per chunk
	}
	return k, nil
}

// Len returns the number of pages in the list.
func (k *PageKeys) Len() int { return len(k.phys) }

// Keys returns the keys of page phys[i], [KVHeads][PageSize][HeadDim]
// (slots past the page's valid length hold unspecified data). On a
// DeviceResident shard the slice is valid until the next call.
func (k *PageKeys) Keys(ctx context.Context, i int) ([]float32, error) {
	if i < 0 || i >= len(k.phys) {
		return nil, fmt.Errorf("page keys: %w: page %d of a list of %d", ErrBadInput, i, len(k.phys))
	}
	if k.pool != nil {
		o := int(k.phys[i]) * k.blk
		return k.pool[o : o+k.blk : o+k.blk], nil
	}
	if i < k.lo || i >= k.lo+k.n {
		n := min(max(KeyChunkBytes/(4*k.blk), 1), len(k.phys)-i)
		if !k.locked {
			k.s.mu.Lock()
		}
		l, err := k.s.readPages(ctx, k.layer, k.phys[i:i+n])
		if !k.locked {
			k.s.mu.Unlock()
		}
		if err != nil {
			return nil, err
		}
		k.buf, k.lo, k.n = l.K, i, n
	}
	o := (i - k.lo) * k.blk
	return k.buf[o : o+k.blk : o+k.blk], nil
}

// hostView returns a layer and batch the CPU reference code can read: the
// shard's own host pools and b itself, or, when the pages live on the
// device or (offload) partly in a tier, a copy of b's pages with b
// renumbered to address it.
func (s *Shard) hostView(ctx context.Context, kl kernels.Layer, layer int, b *kernels.Batch) (kernels.Layer, *kernels.Batch, error) {
	if s.dev == nil && s.off == nil {
		return kl, b, nil
	}
	phys, err := s.batchPhys(b)
	if err != nil {
		return kernels.Layer{}, nil, err
	}
	h, err := s.readPages(ctx, layer, phys)
	if err != nil {
		return kernels.Layer{}, nil, err
	}
	c := &kernels.Batch{Indptr: b.Indptr, LastLen: b.LastLen, Pages: make([]int32, len(phys))}
	for i := range c.Pages {
		c.Pages[i] = int32(i)
	}
	return h, c, nil
}

// batchPhys returns the physical pages b reads, in b's order: b.Pages, or
// the store's page tables when b follows device tables (the host's copy of
// the tables is the store's).
func (s *Shard) batchPhys(b *kernels.Batch) ([]int32, error) {
	if b.Tables == nil {
		return b.Pages, nil
	}
	phys := make([]int32, 0, b.Total())
	for i, id := range b.Tables.Seqs {
		t, err := s.store.AppendPageTable(phys, pagestore.SeqID(id))
		if err != nil {
			return nil, err
		}
		if got := len(t) - len(phys); got < b.NumPages(i) {
			return nil, fmt.Errorf("sequence %d holds %d pages, the step read %d (changed since Begin)", id, got, b.NumPages(i))
		}
		phys = t[:len(phys)+b.NumPages(i)]
	}
	return phys, nil
}
