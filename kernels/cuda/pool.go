//go:build cuda

package cuda

import (
	"context"
	"errors"
	"fmt"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// The page operations of kernels.DeviceStore on device pools, besides
// the token writes (append.go) and the page tables (tables.go).

// NewPool implements kernels.DeviceStore: a DeviceLayer in the backend's
// storage type (plan.FP8 included).
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
		if l.kv8() {
			err = b.launch("quest_rescan_fp8", [3]int{len(pages), l.KVHeads, 1}, min(l.HeadDim, 256), 0,
				u(l.K), u(l.KScale), u(l.Summary), u(list), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.PageSize), uint64(valid))
		} else {
			err = b.launch("quest_rescan_"+l.DType.String(), [3]int{len(pages), l.KVHeads, 1}, min(l.HeadDim, 256), 0,
				u(l.K), u(l.Summary), u(list), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.PageSize), uint64(valid))
		}
		if err != nil {
			return err
		}
		return b.encodeFP8(l, list, 0, len(pages))
	})
}

// CopyPage implements kernels.DeviceStore: three device-to-device copies
// (five for fp8 pages: their K and V scales too), queued, not waited
// for.
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
		if err := b.copyScales(l, dst, src); err != nil {
			return err
		}
		return b.copyFP8(l, dst, src)
	})
}

// ReadPages implements kernels.DeviceStore: it waits for the queued work,
// copies each run of consecutive pages back and converts it to float32
// (fp8 pages: K and V decoded, code value times scale; ReadRecords gives
// the records themselves).
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
			if l.kv8() {
				if l.Slots == 0 { // a slot pool's K/V are addressed by slot (ReadSlotKV)
					k, v, err := b.readDecoded(l, first, n)
					if err != nil {
						return fmt.Errorf("cuda: read pages: %w", err)
					}
					out.K, out.V = append(out.K, k...), append(out.V, v...)
				}
				x, err := readAs(b, l.Summary+cu.DevicePtr(first*l.sumPageBytes()), n*sumN, plan.Float32)
				if err != nil {
					return fmt.Errorf("cuda: read pages: %w", err)
				}
				out.Summary = append(out.Summary, x...)
				i = j
				continue
			}
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
