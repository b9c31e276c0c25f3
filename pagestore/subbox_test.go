package pagestore

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/plan"
)

// subShadow is a test's own copy of a sequence's keys per layer.
type subShadow [][][]float32 // layer -> token -> [KVHeads*HeadDim]

// checkSubBoxes recomputes every sub-box of every page of every live
// sequence from the shadow keys and compares it with the store's, and
// checks the page summary is the union of its sub-boxes.
func checkSubBoxes(t *testing.T, st *Store, seqs map[SeqID]subShadow) {
	t.Helper()
	c := st.Config()
	S, D, H, nb := c.PageSize, c.HeadDim, c.KVHeads, c.SubBoxes
	w := S / nb
	for id, sh := range seqs {
		table, err := st.AppendPageTable(nil, id)
		if err != nil {
			t.Fatal(err)
		}
		for l, toks := range sh {
			for p := 0; p*S < len(toks); p++ {
				for hd := range H {
					subs := st.PageSubBoxes(l, int(table[p]), hd)
					mn, mx := st.PageSummary(l, int(table[p]), hd)
					if len(subs) != nb*2*D {
						t.Fatalf("seq %d layer %d page %d: %d sub-box floats, want %d", id, l, p, len(subs), nb*2*D)
					}
					for j := range D {
						umn, umx := math.Inf(1), math.Inf(-1)
						for b := range nb {
							wmn, wmx := math.Inf(1), math.Inf(-1)
							for r := p*S + b*w; r < min(p*S+(b+1)*w, len(toks)); r++ {
								x := float64(toks[r][hd*D+j])
								wmn, wmx = math.Min(wmn, x), math.Max(wmx, x)
							}
							gmn, gmx := float64(subs[b*2*D+j]), float64(subs[b*2*D+D+j])
							if gmn != wmn || gmx != wmx {
								t.Fatalf("seq %d layer %d page %d head %d sub-box %d dim %d: [%v, %v], want [%v, %v]", id, l, p, hd, b, j, gmn, gmx, wmn, wmx)
							}
							umn, umx = math.Min(umn, gmn), math.Max(umx, gmx)
						}
						if float64(mn[j]) != umn || float64(mx[j]) != umx {
							t.Fatalf("seq %d layer %d page %d head %d dim %d: page box [%v, %v], sub-boxes' union [%v, %v]", id, l, p, hd, j, mn[j], mx[j], umn, umx)
						}
					}
				}
			}
		}
	}
}

// TestSubBoxesRandomOps: sub-box summaries equal the min/max of their
// slots' keys after random appends (across page and sub-box boundaries),
// forks with writes in both branches, rollbacks, truncations and
// releases that recycle pages.
func TestSubBoxesRandomOps(t *testing.T) {
	for _, nb := range []int{2, 4, 8} {
		t.Run(fmt.Sprintf("c%d", nb), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Layers, cfg.KVHeads, cfg.HeadDim, cfg.PageSize, cfg.Capacity, cfg.SubBoxes = 2, 2, 3, 8, 64, nb
			st, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(nb), 7))
			tok := cfg.KVHeads * cfg.HeadDim
			seqs := map[SeqID]subShadow{}
			newSeq := func() SeqID {
				id := st.Create()
				seqs[id] = make(subShadow, cfg.Layers)
				return id
			}
			pick := func() SeqID {
				for id := range seqs {
					return id
				}
				return newSeq()
			}
			newSeq()
			for op := range 400 {
				id := pick()
				r := rng.IntN(10)
				lo, hi := len(seqs[id][0]), len(seqs[id][0])
				for _, toks := range seqs[id] {
					lo, hi = min(lo, len(toks)), max(hi, len(toks))
				}
				if r >= 5 && r < 8 && lo != hi {
					r = 8 // fork and rollback want even layers: truncate instead
				}
				switch {
				case r < 5: // append to every layer
					n := 1 + rng.IntN(2*cfg.PageSize)
					for l := range cfg.Layers {
						k := make([]float32, n*tok)
						v := make([]float32, n*tok)
						for i := range k {
							k[i] = float32(rng.NormFloat64())
						}
						if err := st.Append(id, l, k, v); err != nil {
							if errors.Is(err, ErrPoolExhausted) {
								break
							}
							t.Fatalf("op %d append: %v", op, err)
						}
						for i := range n {
							seqs[id][l] = append(seqs[id][l], k[i*tok:(i+1)*tok])
						}
					}
				case r < 6: // fork
					if len(seqs) > 4 {
						continue
					}
					child, err := st.Fork(id)
					if err != nil {
						if errors.Is(err, ErrPoolExhausted) {
							continue
						}
						t.Fatalf("op %d fork: %v", op, err)
					}
					sh := make(subShadow, cfg.Layers)
					for l := range sh {
						sh[l] = append([][]float32(nil), seqs[id][l]...)
					}
					seqs[child] = sh
				case r < 8: // rollback
					n := len(seqs[id][0])
					if n == 0 {
						continue
					}
					back := 1 + rng.IntN(min(n, 2*cfg.PageSize))
					if err := st.Rollback(id, back); err != nil {
						if errors.Is(err, ErrPoolExhausted) {
							continue
						}
						t.Fatalf("op %d rollback %d of %d: %v", op, back, n, err)
					}
					for l := range seqs[id] {
						seqs[id][l] = seqs[id][l][:len(seqs[id][l])-back]
					}
				case r < 9: // truncate each layer to its own length
					lens := make([]int, cfg.Layers)
					for l := range lens {
						lens[l] = rng.IntN(len(seqs[id][l]) + 1)
					}
					if err := st.Truncate(id, lens); err != nil {
						if errors.Is(err, ErrPoolExhausted) {
							continue
						}
						t.Fatalf("op %d truncate to %v: %v", op, lens, err)
					}
					for l := range seqs[id] {
						seqs[id][l] = seqs[id][l][:lens[l]]
					}
				default: // release (its pages are recycled)
					if err := st.Release(id); err != nil {
						t.Fatalf("op %d release: %v", op, err)
					}
					delete(seqs, id)
				}
				checkSubBoxes(t, st, seqs)
			}
		})
	}
}

// TestSubBoxesConfig: sub-boxes need a divisor of the page size and the
// store's own float32 host pools.
func TestSubBoxesConfig(t *testing.T) {
	base := DefaultConfig()
	base.Capacity, base.Layers = 8, 1
	for _, c := range []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"c4", func(c *Config) { c.SubBoxes = 4 }, true},
		{"c1", func(c *Config) { c.SubBoxes = 1 }, true},
		{"c3", func(c *Config) { c.SubBoxes = 3 }, false},
		{"c32", func(c *Config) { c.SubBoxes = 32 }, false},
		{"negative", func(c *Config) { c.SubBoxes = -2 }, false},
		{"fp8", func(c *Config) { c.SubBoxes = 2; c.DType = plan.FP8 }, false},
		{"offload", func(c *Config) { c.SubBoxes = 2; c.DeviceBudget = 4 }, false},
		{"persist", func(c *Config) { c.SubBoxes = 2; c.DataDir = t.TempDir() }, false},
	} {
		cfg := base
		c.mod(&cfg)
		err := cfg.Validate()
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
		}
	}
	cfg := base
	cfg.SubBoxes = 2
	if _, err := NewWithData(cfg, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewWithData with sub-boxes: %v, want ErrInvalidConfig", err)
	}
	_, sum1, _ := base.PoolBytes()
	_, sum4, _ := func() (int, int, error) { c := base; c.SubBoxes = 4; return c.PoolBytes() }()
	if sum4 != 5*sum1 {
		t.Errorf("summary bytes with 4 sub-boxes: %d, want 5 x %d (page box plus four)", sum4, sum1)
	}
}
