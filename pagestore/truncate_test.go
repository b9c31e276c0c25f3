package pagestore

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestTruncateLayers: Truncate to per-layer lengths leaves every layer's
// K/V and every page summary exactly as a sequence that only ever held
// the kept tokens (checkSeq against the shadow), uneven before and
// after, with shared (forked) pages, and gives back the pages past the
// longest kept layer.
func TestTruncateLayers(t *testing.T) {
	const L, S, H, D = 3, 4, 2, 3
	tok := H * D
	rng := rand.New(rand.NewPCG(27, 1))
	for trial := range 300 {
		s := mustStore(t, Config{Layers: L, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 64})
		id := s.Create()
		sh := newShadow(L)
		base := rng.IntN(13)
		if base > 0 {
			k, v := randKV(rng, base, tok)
			for l := range L {
				appendBoth(t, s, id, sh, l, k, v)
			}
		}
		if trial%3 == 0 && base > 0 {
			// Share the pages with a sibling that stays untouched.
			sib, err := s.Fork(id)
			if err != nil {
				t.Fatal(err)
			}
			shSib := sh.clone()
			defer checkSeq(t, s, sib, shSib)
		}
		have := make([]int, L)
		for l := range L {
			if n := rng.IntN(7); n > 0 {
				k, v := randKV(rng, n, tok)
				appendBoth(t, s, id, sh, l, k, v)
			}
			have[l] = len(sh.k[l]) / tok
		}
		lens := make([]int, L)
		for l := range L {
			lens[l] = have[l] - rng.IntN(have[l]+1)
			if rng.IntN(3) == 0 {
				lens[l] = have[l]
			}
		}
		if err := s.Truncate(id, lens); err != nil {
			t.Fatalf("trial %d: Truncate %v to %v: %v", trial, have, lens, err)
		}
		for l := range L {
			sh.k[l], sh.v[l] = sh.k[l][:lens[l]*tok], sh.v[l][:lens[l]*tok]
		}
		checkSeq(t, s, id, sh)
		checkPool(t, s)
	}
}

func TestTruncateRefuses(t *testing.T) {
	s := mustStore(t, Config{Layers: 2, Geometry: plan.Geometry{KVHeads: 1, HeadDim: 2, PageSize: 4}, Capacity: 8})
	id := s.Create()
	rng := rand.New(rand.NewPCG(1, 2))
	k, v := randKV(rng, 5, 2)
	for l := range 2 {
		if err := s.Append(id, l, k, v); err != nil {
			t.Fatal(err)
		}
	}
	for _, lens := range [][]int{{6, 5}, {-1, 5}, {5}} {
		if err := s.Truncate(id, lens); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("Truncate %v: %v, want ErrOutOfRange", lens, err)
		}
	}
	if n, _ := s.Len(id); n != 5 {
		t.Fatalf("len %d after refused truncates", n)
	}
}
