package gpudecode

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// fillRandom appends n tokens of uniform random K/V in [-1, 1) to every
// layer of sequence id: made on dev and appended there (nothing crosses
// the host) when the engine takes dev's tensors, else made on every core
// of the host and appended through it.
func fillRandom(ctx context.Context, dev Device, e *engine.Engine, id decode.SeqID, layers, n, row int, seed uint64) error {
	const chunk = 1 << 15 // tokens per Append
	seedOf := func(l, lo int, v uint64) uint64 { return seed<<40 | uint64(l)<<20 | uint64(lo>>15)<<1 | v }
	onDevice := true
	for l := range layers {
		for lo := 0; lo < n; lo += chunk {
			if err := ctx.Err(); err != nil {
				return err
			}
			m := min(chunk, n-lo)
			if onDevice {
				err := appendRandomOn(ctx, dev, e, id, l, m, row, seedOf(l, lo, 0), seedOf(l, lo, 1))
				if err == nil {
					continue
				}
				if !errors.Is(err, decode.ErrDeviceTensor) || l > 0 || lo > 0 {
					return fmt.Errorf("random K/V of layer %d at %d: %w", l, lo, err)
				}
				onDevice = false // the engine takes host tokens only
			}
			k, v := randomHost(m*row, seedOf(l, lo, 0)), randomHost(m*row, seedOf(l, lo, 1))
			if err := e.AppendContext(ctx, id, l, k, v); err != nil {
				return fmt.Errorf("random K/V of layer %d at %d: %w", l, lo, err)
			}
		}
	}
	return nil
}

// appendRandomOn appends m tokens of random K/V made on dev (rows of row
// floats, from seeds sk and sv) to layer l of id through the engine's
// device path.
func appendRandomOn(ctx context.Context, dev Device, e *engine.Engine, id decode.SeqID, l, m, row int, sk, sv uint64) error {
	km, err := dev.RandomMatrix(ctx, m, row, plan.Float32, sk, 1, 0)
	if err != nil {
		return err
	}
	defer dev.FreeMatrix(ctx, km)
	vm, err := dev.RandomMatrix(ctx, m, row, plan.Float32, sv, 1, 0)
	if err != nil {
		return err
	}
	defer dev.FreeMatrix(ctx, vm)
	d := dev.Device()
	return e.AppendTensor(ctx, id, l, decode.OnDevice(d, km.Ptr, m*row, 0), decode.OnDevice(d, vm.Ptr, m*row, 0))
}

// randomHost returns n uniform floats in [-1, 1) from seed, made on every
// core.
func randomHost(n int, seed uint64) []float32 {
	dst := make([]float32, n)
	var wg sync.WaitGroup
	w := runtime.GOMAXPROCS(0)
	per := (n + w - 1) / w
	for j := 0; j*per < n; j++ {
		part := dst[j*per : min((j+1)*per, n)]
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(j)))
			for i := range part {
				part[i] = float32(r.Float64()*2 - 1)
			}
		})
	}
	wg.Wait()
	return dst
}
