//go:build cuda

package cuda

import (
	"context"
	"fmt"

	"gorgonia.org/cu"
)

// Merges of partial attention states (merge.cuh).

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

// reduceThreads is the block size of quest_reduce: whole warps, at least
// D/2 threads (each thread owns two dims at most).
func reduceThreads(d int) int { return max(32, min(128, (d+31)/32*32)) }
