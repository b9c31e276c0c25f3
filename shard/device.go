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
	if s.dev != nil {
		l, err := s.ds.ReadPages(ctx, s.dev[layer], phys)
		if err != nil {
			return kernels.Layer{}, fmt.Errorf("read pages of layer %d: %w", layer, err)
		}
		return l, nil
	}
	h := s.store.Layer(layer)
	kv, sum := c.KVHeads*c.PageSize*c.HeadDim, c.KVHeads*2*c.HeadDim
	out := kernels.Layer{K: make([]float32, 0, len(phys)*kv), V: make([]float32, 0, len(phys)*kv), Summary: make([]float32, 0, len(phys)*sum)}
	for _, p := range phys {
		out.K = append(out.K, h.K[int(p)*kv:][:kv]...)
		out.V = append(out.V, h.V[int(p)*kv:][:kv]...)
		out.Summary = append(out.Summary, h.Summary[int(p)*sum:][:sum]...)
	}
	return out, nil
}

// hostView returns a layer and batch the CPU reference code can read: the
// shard's own host pools and b itself, or, when the pages live on the
// device, a copy of b's pages with b renumbered to address it.
func (s *Shard) hostView(ctx context.Context, kl kernels.Layer, layer int, b *kernels.Batch) (kernels.Layer, *kernels.Batch, error) {
	if s.dev == nil {
		return kl, b, nil
	}
	phys := b.Pages
	if b.Tables != nil { // the host's copy of the tables is the store's
		phys = make([]int32, 0, b.Total())
		for i, id := range b.Tables.Seqs {
			t, err := s.store.AppendPageTable(nil, pagestore.SeqID(id))
			if err != nil {
				return kernels.Layer{}, nil, err
			}
			if len(t) < b.NumPages(i) {
				return kernels.Layer{}, nil, fmt.Errorf("sequence %d holds %d pages, the step read %d (changed since Begin)", id, len(t), b.NumPages(i))
			}
			phys = append(phys, t[:b.NumPages(i)]...)
		}
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
