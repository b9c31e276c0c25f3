//go:build cuda

package cuda

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
)

// Device page tables (kernels.DeviceStore): one per sequence, and the
// batch's page list gathered from them on the device.

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
