package pagestore_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
)

// appendLayers appends tokens [from, to) of stream seed to the given
// layers only, and counts them in had (the test's own count of what
// each layer of id holds).
func appendLayers(t testing.TB, s *pagestore.Store, id pagestore.SeqID, seed uint64, layers []int, from, to int, had map[pagestore.SeqID][]int) {
	t.Helper()
	if had[id] == nil {
		had[id] = make([]int, pLayers)
	}
	for i := from; i < to; i++ {
		k, v := tokenKV(seed, i)
		for _, l := range layers {
			if err := s.Append(id, l, k, v); err != nil {
				t.Fatal(err)
			}
			had[id][l]++
		}
	}
}

// unevenCrash writes sequences with uneven layers to a store on dir
// and returns a crash image of it (copied while the store is open) and
// what every layer of every sequence held (counted by the test).
func unevenCrash(t *testing.T, c pagestore.Config) (string, map[pagestore.SeqID][]int) {
	t.Helper()
	s := openP(t, c)
	had := map[pagestore.SeqID][]int{}
	both := []int{0, 1}
	a, b, d := s.Create(), s.Create(), s.Create()
	appendLayers(t, s, a, 1, both, 0, 9, had)      // 9 and 9: a tail of 1 in each
	appendLayers(t, s, a, 1, []int{0}, 9, 11, had) // layer 0 two more: 11 and 9
	appendLayers(t, s, b, 2, both, 0, 6, had)      // 6 and 6
	appendLayers(t, s, b, 2, []int{1}, 6, 7, had)  // layer 1 one more: 6 and 7
	appendLayers(t, s, d, 3, both, 0, 8, had)      // 8 and 8: whole pages
	if err := s.Rollback(d, 3); err != nil {       // 5 and 5
		t.Fatal(err)
	}
	had[d] = []int{5, 5}
	img := copyDir(t, c.DataDir)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return img, had
}

// TestLengthsPerLayer: after a crash (a crash image) with layers of
// different lengths, recovery reports every layer's own length at the
// stop (HadLens), equal to the tokens the test appended to it; the
// longest layer's loss is LostTokens, as before. Format 1 knew only the
// longest layer.
func TestLengthsPerLayer(t *testing.T) {
	img, had := unevenCrash(t, pConfig(t.TempDir()))
	s := openP(t, pConfig(img))
	defer s.Close()
	rep := s.Recovery()
	if rep.Lengths != nil || rep.LengthsFormat != 2 || len(rep.Damaged) != 0 {
		t.Fatalf("lengths %v, format %d, damaged %v", rep.Lengths, rep.LengthsFormat, rep.Damaged)
	}
	if len(rep.Sequences) != len(had) {
		t.Fatalf("recovered %+v, want %d sequences", rep.Sequences, len(had))
	}
	for _, r := range rep.Sequences {
		want := had[r.ID]
		if !slices.Equal(r.HadLens, want) {
			t.Errorf("seq %d: had %v per layer, appended %v", r.ID, r.HadLens, want)
		}
		hi := 0
		for l := range pLayers {
			n, err := s.LayerLen(r.ID, l)
			if err != nil {
				t.Fatal(err)
			}
			hi = max(hi, n)
			if n != slices.Min(want)/pS*pS {
				t.Errorf("seq %d layer %d: recovered %d of %d", r.ID, l, n, want[l])
			}
		}
		if r.LostTokens != slices.Max(want)-hi {
			t.Errorf("seq %d: lost %d, want %d", r.ID, r.LostTokens, slices.Max(want)-hi)
		}
	}
}

// TestOpenLengthsV1: a crash image written by the format-1 code
// (testdata/lengths-v1, see its README) opens: its sequences come back
// with their tokens bit for bit and the longest layer's loss
// (LostTokens) as format 1 recorded it, no per-layer lengths
// (HadLens nil); the file is rewritten in format 2, so that after the
// next crash every layer's loss is known.
func TestOpenLengthsV1(t *testing.T) {
	dir := t.TempDir()
	ents, err := os.ReadDir("testdata/lengths-v1")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "README" {
			continue
		}
		b, err := os.ReadFile(filepath.Join("testdata/lengths-v1", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := pConfig(dir)
	c.Capacity = 8
	s := openP(t, c)
	rep := s.Recovery()
	if rep.LengthsFormat != 1 || rep.Lengths != nil || len(rep.Damaged) != 0 || len(rep.Sequences) != 2 {
		t.Fatalf("format %d, lengths %v, recovered %+v, damaged %v", rep.LengthsFormat, rep.Lengths, rep.Sequences, rep.Damaged)
	}
	// The README's sequences: 1 held 10 and 9 tokens, 2 held 6 and 6.
	// The reference holds what each recovered.
	ref := openP(t, pagestore.Config{Layers: pLayers, Geometry: c.Geometry, Capacity: 8, MemoryLimit: -1})
	defer ref.Close()
	for i, tc := range []struct {
		id          pagestore.SeqID
		seed        uint64
		longest, to int
	}{{1, 1, 10, 8}, {2, 2, 6, 4}} {
		r := rep.Sequences[i]
		if r.ID != tc.id || r.Len != tc.to || r.LostTokens != tc.longest-tc.to || r.HadLens != nil || r.TailPersisted {
			t.Fatalf("recovered %+v, want seq %d at %d tokens, %d lost, no per-layer lengths", r, tc.id, tc.to, tc.longest-tc.to)
		}
		rid := ref.Create()
		appendLayers(t, ref, rid, tc.seed, []int{0, 1}, 0, tc.to, map[pagestore.SeqID][]int{})
		sameSummaries(t, "format 1", s, ref, r.ID, rid, tc.to/pS)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "lengths"))
	if err != nil {
		t.Fatal(err)
	}
	if string(raw[:7]) != "QRTLENS" {
		t.Fatalf("lengths file not rewritten in format 2: % x", raw[:16])
	}
	// The next crash: uneven layers, every one known.
	had := map[pagestore.SeqID][]int{1: {8, 8}, 2: {4, 4}}
	appendLayers(t, s, 1, 1, []int{0}, 8, 10, had)
	appendLayers(t, s, 2, 2, []int{1}, 4, 7, had)
	img := copyDir(t, dir)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	c.DataDir = img
	s = openP(t, c)
	defer s.Close()
	rep = s.Recovery()
	if rep.LengthsFormat != 2 || rep.Lengths != nil || len(rep.Sequences) != 2 {
		t.Fatalf("after the format-2 crash: format %d, lengths %v, recovered %+v", rep.LengthsFormat, rep.Lengths, rep.Sequences)
	}
	for _, r := range rep.Sequences {
		if !slices.Equal(r.HadLens, had[r.ID]) {
			t.Errorf("seq %d: had %v per layer, appended %v", r.ID, r.HadLens, had[r.ID])
		}
	}
}

// TestLengthsCorrupt flips every byte of the lengths file of a crash
// image, one at a time, with several masks: the store opens, nothing
// panics, every sequence is recovered with its pages, and each layer's
// reported length at the stop (HadLens) is either the true one or
// unknown (-1, or nil for the whole record) with the damage reported
// (RecoveryReport.Lengths wrapping tier.ErrCorrupt). LostTokens never
// exceeds the true loss.
func TestLengthsCorrupt(t *testing.T) {
	img, had := unevenCrash(t, pConfig(t.TempDir()))
	pristine, err := os.ReadFile(filepath.Join(img, "lengths"))
	if err != nil {
		t.Fatal(err)
	}
	reported, unaffected := 0, 0
	for pos := range pristine {
		for _, mask := range []byte{0x01, 0x80, 0xff} {
			dir := copyDir(t, img)
			b := slices.Clone(pristine)
			b[pos] ^= mask
			if err := os.WriteFile(filepath.Join(dir, "lengths"), b, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := pagestore.New(pConfig(dir))
			if err != nil {
				t.Fatalf("byte %d ^ %#x: open: %v", pos, mask, err)
			}
			rep := s.Recovery()
			if len(rep.Sequences) != len(had) || len(rep.Damaged) != 0 {
				t.Fatalf("byte %d ^ %#x: recovered %+v, damaged %v", pos, mask, rep.Sequences, rep.Damaged)
			}
			wrong := false
			for _, r := range rep.Sequences {
				want := had[r.ID]
				hi := 0
				for l := range pLayers {
					n, _ := s.LayerLen(r.ID, l)
					hi = max(hi, n)
				}
				if r.LostTokens > slices.Max(want)-hi {
					t.Errorf("byte %d ^ %#x: seq %d lost %d, more than %d", pos, mask, r.ID, r.LostTokens, slices.Max(want)-hi)
				}
				if r.HadLens == nil {
					wrong = true
					continue
				}
				for l, n := range r.HadLens {
					if n == -1 {
						wrong = true
					} else if n != want[l] {
						t.Errorf("byte %d ^ %#x: seq %d layer %d had %d, appended %d", pos, mask, r.ID, l, n, want[l])
					}
				}
			}
			switch {
			case wrong && !errors.Is(rep.Lengths, tier.ErrCorrupt):
				t.Errorf("byte %d ^ %#x: lengths unknown, not reported (%v)", pos, mask, rep.Lengths)
			case wrong:
				reported++
			case rep.Lengths == nil:
				unaffected++ // padding
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			os.RemoveAll(dir)
		}
	}
	t.Logf("%d bytes x 3 masks: %d reported, %d unaffected (padding)", len(pristine), reported, unaffected)
	if reported == 0 {
		t.Fatal("no flip was detected")
	}
}
