package demo

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"
)

// generator makes the synthetic data: Gaussian noise keys, entity A keys at
// Mentions positions spread over the context, entity B's needle keys at a
// few early positions (at a page's start, middle and end), and queries that
// point at A or B.
type generator struct {
	cfg      Config
	rng      *rand.Rand
	dirA     [][]float32 // [layer][KVHeads*D] unit directions
	dirB     [][]float32
	isA      map[int]bool
	isB      map[int]bool
	needles  []int
	mentions int // tokens of A (a mention on a needle's token is left out)
	noiseAmp float32
	entAmp   float32
	qAmp     float32
}

func newGenerator(cfg Config) *generator {
	g := &generator{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 42)), isA: map[int]bool{}, isB: map[int]bool{}}
	d := cfg.HeadDim
	g.noiseAmp = 1
	g.entAmp = float32(math.Sqrt(float64(d)))
	g.qAmp = 3
	unit := func() []float32 {
		v := make([]float32, cfg.KVHeads*d)
		for h := range cfg.KVHeads {
			var n float64
			for j := range d {
				x := g.rng.NormFloat64()
				v[h*d+j] = float32(x)
				n += x * x
			}
			for j := range d {
				v[h*d+j] /= float32(math.Sqrt(n))
			}
		}
		return v
	}
	for range cfg.Layers {
		g.dirA = append(g.dirA, unit())
		g.dirB = append(g.dirB, unit())
	}
	// Needles in the first quarter, at a page start, middle and end.
	s := cfg.PageSize
	for i := range cfg.Needles {
		page := (i + 1) * (cfg.Context / 4 / s) / (cfg.Needles + 1)
		off := []int{0, s / 2, s - 1}[i%3]
		t := page*s + off
		g.needles = append(g.needles, t)
		g.isB[t] = true
	}
	for i := range cfg.Mentions {
		t := (i*cfg.Context)/max(cfg.Mentions, 1) + cfg.PageSize/3
		if t < cfg.Context && !g.isB[t] && !g.isA[t] {
			g.isA[t] = true
			g.mentions++
		}
	}
	return g
}

func (g *generator) needleOffsets() []int {
	var o []int
	for _, t := range g.needles {
		o = append(o, t%g.cfg.PageSize)
	}
	return o
}

// needlesRead reports whether every needle page is in the attended list.
func (g *generator) needlesRead(sel []int32) bool {
	for _, t := range g.needles {
		p := int32(t / g.cfg.PageSize)
		found := false
		for _, x := range sel {
			if x == p {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func (g *generator) prefill(ctx context.Context, dec decoder, w io.Writer) error {
	cfg := g.cfg
	tok := cfg.KVHeads * cfg.HeadDim
	const chunk = prefillChunk
	k := make([]float32, chunk*tok)
	v := make([]float32, chunk*tok)
	state := uint64(cfg.Seed)*0x9e3779b97f4a7c15 + 1
	next := time.Now()
	for layer := range cfg.Layers {
		for t0 := 0; t0 < cfg.Context; t0 += chunk {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(chunk, cfg.Context-t0)
			state = gaussFill(k[:n*tok], state, g.noiseAmp)
			state = gaussFill(v[:n*tok], state, 1)
			for i := range n {
				var dir []float32
				switch t := t0 + i; {
				case g.isA[t]:
					dir = g.dirA[layer]
				case g.isB[t]:
					dir = g.dirB[layer]
				default:
					continue
				}
				for j := range tok {
					k[i*tok+j] += g.entAmp * dir[j]
				}
			}
			if err := dec.append(ctx, layer, k[:n*tok], v[:n*tok]); err != nil {
				return fmt.Errorf("demo prefill layer %d: %w", layer, err)
			}
			if time.Now().After(next) {
				done := layer*cfg.Context + t0 + n
				fmt.Fprintf(w, "  building context: %5.1f%% (layer %d, token %d)\n", 100*float64(done)/float64(cfg.Layers*cfg.Context), layer, t0+n)
				next = time.Now().Add(time.Second)
			}
		}
	}
	return nil
}

// gaussFill fills x with approximately Gaussian values (sum of four
// uniforms, variance matched) times amp, from a splitmix64 state.
func gaussFill(x []float32, s uint64, amp float32) uint64 {
	for i := range x {
		var acc float32
		for range 2 {
			s += 0x9e3779b97f4a7c15
			z := s
			z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
			z = (z ^ (z >> 27)) * 0x94d049bb133111eb
			z ^= z >> 31
			acc += float32(uint32(z))/(1<<32) + float32(uint32(z>>32))/(1<<32)
		}
		// Sum of 4 U(0,1): mean 2, variance 1/3.
		x[i] = (acc - 2) * 1.7320508 * amp
	}
	return s
}

// query builds q for every query head: each group points at its KV head's
// A or B direction, with per-head noise.
func (g *generator) query(layer int, askB bool) []float32 {
	cfg := g.cfg
	d := cfg.HeadDim
	dir := g.dirA[layer]
	if askB {
		dir = g.dirB[layer]
	}
	gs := cfg.QHeads / cfg.KVHeads
	q := make([]float32, cfg.QHeads*d)
	for h := range cfg.QHeads {
		kvh := h / gs
		for j := range d {
			q[h*d+j] = g.qAmp*dir[kvh*d+j]*float32(math.Sqrt(float64(d)))/2 + float32(g.rng.NormFloat64())*0.5
		}
	}
	return q
}

// token makes the new decode token's k and v (noise).
func (g *generator) token() ([]float32, []float32) {
	n := g.cfg.KVHeads * g.cfg.HeadDim
	k := make([]float32, n)
	v := make([]float32, n)
	for i := range k {
		k[i] = float32(g.rng.NormFloat64()) * g.noiseAmp
		v[i] = float32(g.rng.NormFloat64())
	}
	return k, v
}
