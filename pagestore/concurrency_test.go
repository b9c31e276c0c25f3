package pagestore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestConcurrentSequences appends to 8 sequences from 8 goroutines (random
// chunk sizes, two layers), with forks and rollbacks mixed in, and checks
// each against its shadow. Run with -race.
// With offload on (a device budget of 48 pages, or 24, for 16 sequences), the
// goroutines also recall pages of their sequences, as steps do.
// With prefetch, they also reserve prefetches of other pages of their
// sequences, read by a loader goroutine while they go on.
func TestConcurrentSequences(t *testing.T) {
	for _, tc := range []struct {
		budget   int
		prefetch bool
	}{{0, false}, {48, false}, {24, true}} {
		t.Run(fmt.Sprintf("budget%d_prefetch%v", tc.budget, tc.prefetch), func(t *testing.T) { testConcurrentSequences(t, tc.budget, tc.prefetch) })
	}
}

func testConcurrentSequences(t *testing.T, budget int, prefetch bool) {
	const G, L, S, H, D = 8, 2, 4, 2, 4
	s := mustStore(t, Config{Layers: L, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: G * 64, DeviceBudget: budget})
	defer s.Close()
	var loader *asyncLoader
	if prefetch {
		loader = newAsyncLoader(s)
	}
	ids := make([]SeqID, G)
	shadows := make([]*shadowSeq, G)
	forks := make([]SeqID, G)
	forkShadows := make([]*shadowSeq, G)
	var wg sync.WaitGroup
	for g := range G {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 77))
			id := s.Create()
			sh := newShadow(L)
			for step := range 40 {
				n := 1 + rng.IntN(5)
				k, v := randKV(rng, n, H*D)
				for l := range L {
					if err := s.Append(id, l, k, v); err != nil {
						t.Error(err)
						return
					}
					sh.k[l] = append(sh.k[l], k...)
					sh.v[l] = append(sh.v[l], v...)
				}
				switch {
				case budget > 0 && step%5 == 4:
					pt, err := s.AppendPageTable(nil, id)
					want := pt[:min(len(pt), 3)]
					if prefetch {
						// Pages anywhere: offloaded ones come back clean,
						// victims for the prefetches.
						rng.Shuffle(len(pt), func(a, b int) { pt[a], pt[b] = pt[b], pt[a] })
						want = pt[:min(len(pt), 3)]
					}
					if err == nil {
						err = s.Recall(context.Background(), want)
					}
					if err != nil {
						t.Error(err)
						return
					}
					if prefetch && len(pt) > 5 {
						for _, f := range s.ReservePrefetch(pt[3:5], want, 0, nil) {
							loader.ch <- f
						}
					}
				case step == 20:
					f, err := s.Fork(id)
					if err != nil {
						t.Error(err)
						return
					}
					forks[g], forkShadows[g] = f, sh.clone()
				case step%7 == 6:
					total := len(sh.k[0]) / (H * D)
					back := 1 + rng.IntN(min(total, 6))
					if err := s.Rollback(id, back); err != nil {
						t.Error(err)
						return
					}
					sh.truncate(H*D, total-back)
				}
			}
			ids[g], shadows[g] = id, sh
		})
	}
	wg.Wait()
	if prefetch {
		loader.stop()
		if st := s.ResidencyStats(); st.PrefetchIssued == 0 || st.PrefetchPending != 0 {
			t.Errorf("prefetch not exercised or reservations left: %+v", st)
		}
	}
	if t.Failed() {
		return
	}
	for g := range G {
		checkSeq(t, s, ids[g], shadows[g])
		checkSeq(t, s, forks[g], forkShadows[g])
	}
	checkPool(t, s)
	checkRes(t, s)
	if st := s.Stats(); st.Sequences != 2*G {
		t.Fatalf("stats %+v, want %d sequences", st, 2*G)
	}
}

// TestConcurrentSameSequence: two goroutines append to one sequence; the
// per-sequence mutex serializes them, the final length is the sum and each
// writer's tokens appear in its own order.
func TestConcurrentSameSequence(t *testing.T) {
	const N, S, D = 300, 4, 2
	s := mustStore(t, Config{Layers: 1, Geometry: plan.Geometry{KVHeads: 1, HeadDim: D, PageSize: S}, Capacity: 2 * N / S})
	id := s.Create()
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := range N {
				k := []float32{float32(w), float32(i)}
				if err := s.Append(id, 0, k, k); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n, err := s.Len(id); err != nil || n != 2*N {
		t.Fatalf("Len = %d, %v; want %d", n, err, 2*N)
	}
	next := [2]int{}
	pt := pageTable(t, s, id)
	keys := make([]float32, 0, 2*N*D)
	for tok := range 2 * N {
		k, _ := s.PageKV(0, int(pt[tok/S]), 0)
		w, i := int(k[tok%S*D]), int(k[tok%S*D+1])
		if i != next[w] {
			t.Fatalf("token %d: writer %d item %d, want item %d", tok, w, i, next[w])
		}
		next[w]++
		keys = append(keys, k[tok%S*D:tok%S*D+D]...)
	}
	sh := newShadow(1)
	sh.k[0], sh.v[0] = keys, keys
	checkSeq(t, s, id, sh)
}

// TestReadSiblingWhileAppending reads a forked sibling's pages and summaries
// while the other branch appends and rolls back (copy-on-write of the shared
// tail): the race detector flags any write to a page the reader uses.
func TestReadSiblingWhileAppending(t *testing.T) {
	const L, S, H, D = 2, 4, 2, 4
	s := mustStore(t, Config{Layers: L, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 256})
	rng := rand.New(rand.NewPCG(21, 21))
	par := s.Create()
	sh := newShadow(L)
	k, v := randKV(rng, 14, H*D)
	for l := range L {
		appendBoth(t, s, par, sh, l, k, v)
	}
	child, err := s.Fork(par)
	if err != nil {
		t.Fatal(err)
	}
	pt := pageTable(t, s, par)
	view, _ := s.View(par, 0)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var sum float32
		for {
			select {
			case <-done:
				_ = sum
				return
			default:
			}
			for l := range L {
				for p := range view.Pages {
					valid := S
					if p == view.Pages-1 {
						valid = view.LastPageLen
					}
					for h := range H {
						kk, vv := s.PageKV(l, int(pt[p]), h)
						mn, mx := s.PageSummary(l, int(pt[p]), h)
						for i := range valid * D {
							sum += kk[i] + vv[i]
						}
						sum += mn[0] + mx[D-1]
					}
				}
			}
		}
	})
	shC := sh.clone()
	for range 50 {
		for l := range L {
			k, v := randKV(rng, 3, H*D)
			appendBoth(t, s, child, shC, l, k, v)
		}
		if err := s.Rollback(child, 2); err != nil {
			t.Fatal(err)
		}
		shC.truncate(H*D, len(shC.k[0])/(H*D)-2)
	}
	close(done)
	wg.Wait()
	checkSeq(t, s, par, sh)
	checkSeq(t, s, child, shC)
	checkPool(t, s)
}
