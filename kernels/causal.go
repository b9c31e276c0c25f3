package kernels

import (
	"context"
	"math"

	"github.com/questrt/questrt/internal/parfor"
)

// CausalShape is the head layout of a dense causal attention: Heads query
// heads share KVHeads key/value heads (Heads % KVHeads == 0, query head h
// reading KV head h/(Heads/KVHeads)), each of HeadDim floats.
type CausalShape struct {
	Heads, KVHeads, HeadDim int
}

// Tiles of the causal kernel: a block of qBlock positions (times the
// query heads of one KV head) passes over the keys keyTile at a time, so
// each key and value tile is read from memory once per block.
const (
	qBlock  = 16
	keyTile = 32
)

// CausalAttention writes into out the attention of n queries (q:
// [n][Heads][HeadDim]) at positions base..base+n-1 over the keys and
// values k, v ([base+n][KVHeads][HeadDim]), each query seeing positions
// up to its own: the dense prefill of the CPU model. It is a tiled
// online-softmax (flash-attention style) float32 kernel over the AVX2
// loops of vec_amd64.s (ScoreRows, ExpSum, AccumRows) on up to workers
// goroutines (0: GOMAXPROCS). Unlike the Backend's decode kernels it
// allocates its scratch per call (one call per layer of a prompt chunk).
// It returns ctx's error when ctx ends first (out is then incomplete).
func CausalAttention(ctx context.Context, workers int, g CausalShape, q []float32, n int, k, v []float32, base int, out []float32) error {
	d, grp := g.HeadDim, g.Heads/g.KVHeads
	blocks := (n + qBlock - 1) / qBlock
	units := g.KVHeads * blocks
	scale := float32(1 / math.Sqrt(float64(d)))
	type scratch struct {
		s    []float32 // [keyTile]
		acc  []float32 // [rows][D]
		m, l []float32 // [rows]
		stop bool
	}
	nw := parfor.Workers(workers)
	scr := make([]scratch, nw)
	for i := range scr {
		scr[i] = scratch{s: make([]float32, keyTile),
			acc: make([]float32, qBlock*grp*d), m: make([]float32, qBlock*grp), l: make([]float32, qBlock*grp)}
	}
	stride := g.KVHeads * d
	parfor.Run(nw, units, func(w, u int) {
		sc := &scr[w]
		if sc.stop {
			return
		}
		if ctx.Err() != nil {
			sc.stop = true
			return
		}
		// Heaviest blocks (latest positions) first.
		b := blocks - 1 - u/g.KVHeads
		kvh := u % g.KVHeads
		i0, i1 := b*qBlock, min((b+1)*qBlock, n)
		rows := (i1 - i0) * grp
		for r := range rows {
			sc.m[r] = float32(math.Inf(-1))
			sc.l[r] = 0
		}
		clear(sc.acc[:rows*d])
		end := base + i1 // keys [0, end) are seen by some row of the block
		for t0 := 0; t0 < end; t0 += keyTile {
			t1 := min(t0+keyTile, end)
			kt, vt := k[t0*stride+kvh*d:], v[t0*stride+kvh*d:]
			for r := range rows {
				i, h := i0+r/grp, kvh*grp+r%grp
				lim := min(t1, base+i+1) - t0 // keys of this tile the row sees
				if lim <= 0 {
					continue
				}
				s := sc.s[:lim]
				mt := ScoreRows(q[(i*g.Heads+h)*d:][:d], kt, stride, scale, s)
				acc := sc.acc[r*d : (r+1)*d]
				m := sc.m[r]
				if mt > m {
					if sc.l[r] != 0 {
						c := ExpNeg(m - mt)
						sc.l[r] *= c
						for j := range acc {
							acc[j] *= c
						}
					}
					m = mt
					sc.m[r] = m
				}
				sc.l[r] += ExpSum(s, m)
				AccumRows(s, vt, stride, acc)
			}
		}
		for r := range rows {
			i, h := i0+r/grp, kvh*grp+r%grp
			o := out[(i*g.Heads+h)*d:][:d]
			inv := 1 / sc.l[r]
			for j, x := range sc.acc[r*d : (r+1)*d] {
				o[j] = x * inv
			}
		}
	})
	return ctx.Err()
}

// ExpNeg returns e^x for x <= 0 in float32 (about 2 ulp): the softmax
// exponential of CausalAttention, where math.Exp would be a third of the
// attention time. x below -80 is taken as -80 (like expSumAVX2: the
// result stays a normal number).
func ExpNeg(x float32) float32 {
	x = max(x, -80)
	// x = n*ln2 + r, |r| <= ln2/2; e^x = 2^n * e^r.
	const log2e = 1.44269504088896341
	const ln2hi, ln2lo = 0.693359375, -2.12194440e-4
	n := float32(math.Floor(float64(x*log2e + 0.5)))
	r := x - n*ln2hi - n*ln2lo
	// Cephes expf polynomial on [-ln2/2, ln2/2].
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	e := p*r*r + r + 1
	return e * math.Float32frombits(uint32(int32(n)+127)<<23)
}
