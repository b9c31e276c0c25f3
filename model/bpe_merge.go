package model

// This file is the BPE merge loop of one pre-token, shared by the
// byte-level and SentencePiece-style paths.

// bpeSymbol is a symbol of a word being merged: a doubly linked list
// over the word's bytes.
type bpeSymbol struct {
	id         int32
	prev, next int32 // -1 at the ends
	dead       bool
}

// merge runs BPE on w's symbols (its bytes, or for the SentencePiece
// path its characters), lowest rank first and leftmost first among equal
// ranks (the Rust crate's order), with a binary heap of candidate pairs:
// O(n log n) for n symbols. It appends the ids to ids.
func (t *BPETokenizer) merge(w string, ids []int) []int {
	var symBuf [64]bpeSymbol
	var heapBuf [64]uint64
	sym := symBuf[:0]
	if len(w) > len(symBuf) {
		sym = make([]bpeSymbol, 0, len(w))
	}
	if t.spm != nil {
		sym = t.spm.symbols(t, w, sym)
	} else {
		for i := range len(w) {
			sym = append(sym, bpeSymbol{id: int32(t.byteID[w[i]])})
		}
	}
	n := len(sym)
	if n == 0 {
		return ids
	}
	for i := range sym {
		sym[i].prev, sym[i].next = int32(i-1), int32(i+1)
	}
	sym[n-1].next = -1
	h := bpeHeap(heapBuf[:0])
	for i := 0; i+1 < n; i++ {
		if m, ok := t.merges[pairKey(int(sym[i].id), int(sym[i+1].id))]; ok {
			h.push(uint64(uint32(m.rank))<<32 | uint64(i))
		}
	}
	for len(h) > 0 {
		top := h.pop()
		rank, pos := int32(top>>32), int32(uint32(top))
		s := &sym[pos]
		if s.dead || s.next < 0 {
			continue
		}
		nx := &sym[s.next]
		m, ok := t.merges[pairKey(int(s.id), int(nx.id))]
		if !ok || m.rank != rank {
			continue // stale: one of the pair has merged since
		}
		s.id = m.id
		nx.dead = true
		s.next = nx.next
		if s.next >= 0 {
			sym[s.next].prev = pos
			if m2, ok := t.merges[pairKey(int(s.id), int(sym[s.next].id))]; ok {
				h.push(uint64(uint32(m2.rank))<<32 | uint64(pos))
			}
		}
		if s.prev >= 0 {
			if m2, ok := t.merges[pairKey(int(sym[s.prev].id), int(s.id))]; ok {
				h.push(uint64(uint32(m2.rank))<<32 | uint64(s.prev))
			}
		}
	}
	for i := int32(0); i >= 0; i = sym[i].next {
		ids = append(ids, int(sym[i].id))
	}
	return ids
}

// bpeHeap is a min-heap of rank<<32 | position.
type bpeHeap []uint64

func (h *bpeHeap) push(v uint64) {
	*h = append(*h, v)
	a := *h
	i := len(a) - 1
	for i > 0 {
		p := (i - 1) / 2
		if a[p] <= a[i] {
			break
		}
		a[p], a[i] = a[i], a[p]
		i = p
	}
}

func (h *bpeHeap) pop() uint64 {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a = a[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(a) {
			break
		}
		c := l
		if r := l + 1; r < len(a) && a[r] < a[l] {
			c = r
		}
		if a[i] <= a[c] {
			break
		}
		a[i], a[c] = a[c], a[i]
		i = c
	}
	*h = a
	return top
}
