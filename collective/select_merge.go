package collective

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// The merge of SelectExact. After parseSelect, g.keys[rank] holds that
// rank's candidates of every row as sort keys in ascending key order
// (Compare's order; a view of its frame or a copy), a row's at
// g.rowAt[row*size+rank] with g.cnt[row*size+rank] keys. A row's global
// top-t (t = min(k, total)) is then the first cut[r] keys of each rank's
// list for counts cut that sum to t and leave no taken key above an
// untaken one:
//
//   - every candidate fits (total <= k, always so on one rank): cut = cnt;
//   - two ranks: a binary search for the split, O(log k);
//   - more ranks: runs taken from the list whose run ends lowest, about
//     N*ln(t) rounds of N steps.
//
// The taken pages are then put in ascending order through a bitmap over
// their range (O(t + range/64), which also finds duplicates), or by a sort
// when the range is too wide for it; SelectExactUnordered writes them as
// they are cut and checks for duplicates through per-page stamps (O(t)).
// Nothing is allocated once g's scratch and dst's rows have grown to the
// call's sizes.

// bitmapWords bounds the bitmap of a row of t pages, in 64-bit words:
// scanning a word costs about what one step of a sort does, and a sort of
// t pages makes about t*log2(t) steps, more than 4t for t > 16.
func bitmapWords(t int) int { return 4*t + 64 }

// anyPages bounds the page range of a row that emitAny stamps (4 MiB of
// stamps: 16Mi tokens at 16-token pages); the stamps are touched only at
// the taken pages, so their size costs memory, not time.
const anyPages = 1 << 20

// selectRow appends row's global top-k pages to out (empty): ascending
// when ordered, else in emitAny's order.
func (g *Group) selectRow(row, k int, out []int32, ordered bool) ([]int32, error) {
	n := g.size
	at, cnt, cut := g.rowAt[row*n:][:n], g.cnt[row*n:][:n], g.pos[:n]
	total := 0
	for _, c := range cnt {
		total += c
	}
	t := min(k, total)
	switch {
	case t == total:
		copy(cut, cnt)
	case n == 2:
		a, b := g.keys[0][at[0]:][:cnt[0]], g.keys[1][at[1]:][:cnt[1]]
		cut[0] = split2(a, b, t)
		cut[1] = t - cut[0]
	default:
		g.cutN(at, cnt, t, cut)
	}
	if !ordered {
		return g.emitAny(row, at, cut, t, out)
	}
	return g.emitRow(row, at, cut, t, out)
}

// split2 returns how many of the t smallest keys of the union of the
// ascending lists a and b (t <= len(a)+len(b)) come from a: the least i
// with a[i] >= b[t-i-1], which makes a[:i] and b[:t-i] the t smallest
// (a[i-1] < b[t-i] and b[t-i-1] <= a[i]). Equal keys (one page proposed
// twice with one score) may split either way: the taken values are the
// same.
func split2(a, b []uint64, t int) int {
	lo, hi := max(0, t-len(b)), min(t, len(a))
	for lo < hi {
		i := int(uint(lo+hi) >> 1) // lo <= i < hi: a[i] and b[t-i-1] exist
		if a[i] < b[t-i-1] {
			lo = i + 1
		} else {
			hi = i
		}
	}
	return lo
}

// cutN sets cut[r] to the number of rank r's keys among the row's t
// smallest (t <= total) for the ranks' ascending lists at at[r] with
// cnt[r] keys. It takes whole runs: with need keys still to take and
// step = max(1, need/N), the run of up to step keys of the list whose
// run ends lowest is among the need smallest (fewer than need keys of the
// lists lie below its last key: at most step-1 before it in each list).
// Each round takes at least need/N keys, so about N*ln(t) rounds of N
// steps, instead of t steps of a merge.
func (g *Group) cutN(at, cnt []int, t int, cut []int) {
	keys, n := g.keys, len(at)
	clear(cut)
	for need := t; need > 0; {
		step := max(1, need/n)
		best, bs, bk := -1, 0, noKey
		for r, p := range at {
			s := min(step, cnt[r]-cut[r])
			if s == 0 {
				continue
			}
			if k := keys[r][p+cut[r]+s-1]; best < 0 || k < bk {
				best, bs, bk = r, s, k
			}
		}
		cut[best] += bs
		need -= bs
	}
}

// emitAny writes the pages of the first cut[r] keys of each rank's list
// of row (t in all) to out in rank order, each rank's best first, and
// reports a page taken twice as emitRow does. A page is taken twice when
// its stamp (g.stamp over the pages' range, no clearing between rows)
// already holds this row's generation; a range wider than anyPages goes
// to emitRow.
func (g *Group) emitAny(row int, at, cut []int, t int, out []int32) ([]int32, error) {
	if t == 0 {
		return out[:0], nil
	}
	lo, hi := g.pageRange(row, cut)
	span := int(hi-lo) + 1
	if span > anyPages {
		return g.emitRow(row, at, cut, t, out)
	}
	if cap(out) < t {
		out = make([]int32, t)
	}
	out = out[:t]
	if len(g.stamp) < span {
		g.stamp = make([]uint32, min(max(span, 2*len(g.stamp)), anyPages))
		g.gen = 0
	}
	g.gen++
	if g.gen == 0 { // wrapped: stamps of old rows could match
		clear(g.stamp)
		g.gen = 1
	}
	gen, stamp := g.gen, g.stamp[:span]
	j, dup := 0, false
	for r, c := range cut {
		for _, key := range g.keys[r][at[r]:][:c] {
			p := uint32(key)
			s := &stamp[p-lo]
			dup = dup || *s == gen
			*s = gen
			out[j] = int32(p)
			j++
		}
	}
	if dup {
		return g.emitRow(row, at, cut, t, out) // names the page
	}
	return out, nil
}

// pageRange returns the smallest and largest page of the ranks with a
// cut[r] > 0 in row: it bounds the range of the taken pages.
func (g *Group) pageRange(row int, cut []int) (lo, hi uint32) {
	lo, hi = uint32(math.MaxUint32), uint32(0)
	for r, c := range cut {
		if c > 0 {
			lo, hi = min(lo, g.plo[row*g.size+r]), max(hi, g.phi[row*g.size+r])
		}
	}
	return lo, hi
}

// emitRow writes the pages of the first cut[r] keys of each rank's list
// of row (t in all) to out in ascending order.
func (g *Group) emitRow(row int, at, cut []int, t int, out []int32) ([]int32, error) {
	if cap(out) < t {
		out = make([]int32, t)
	}
	out = out[:t]
	if t == 0 {
		return out, nil
	}
	// The range of the ranks' pages bounds that of the taken ones.
	lo, hi := g.pageRange(row, cut)
	if words := int((hi-lo)>>6) + 1; words <= bitmapWords(t) {
		if g.emitBitmap(at, cut, lo, words, out) {
			return out, nil
		}
	}
	j := 0
	for r, c := range cut {
		for _, key := range g.keys[r][at[r]:][:c] {
			out[j] = int32(uint32(key))
			j++
		}
	}
	slices.Sort(out)
	for i := 1; i < len(out); i++ {
		if out[i] == out[i-1] {
			return nil, fmt.Errorf("%w: row %d: page %d", ErrDuplicatePage, row, out[i])
		}
	}
	return out, nil
}

// emitBitmap orders the taken pages (all in [lo, lo+64*words)) through
// g.bits into out, leaving g.bits zero. It returns false when a page is
// taken twice (fewer pages come out than went in): the sort path then
// reports it.
//
// A row's pages are thin in their range (at 2 ranks, 128 of 8192 pages:
// about one per word), so a loop over each word's set bits would
// mispredict its exit about once per word, and a test for empty words
// as often. Each word instead writes its first two pages unconditionally
// (a page past the word's last lands where the next word's first goes,
// or in the slack of g.flat) and advances by its population count; only
// words of more than two pages loop.
func (g *Group) emitBitmap(at, cut []int, lo uint32, words int, out []int32) bool {
	if cap(g.bits) < words {
		g.bits = make([]uint64, words, max(words, 2*cap(g.bits)))
	}
	bm := g.bits[:words]
	for r, c := range cut {
		for _, key := range g.keys[r][at[r]:][:c] {
			o := uint32(key) - lo
			bm[o>>6] |= 1 << (o & 63)
		}
	}
	if cap(g.flat) < len(out)+2 {
		g.flat = make([]int32, len(out)+2, 2*len(out)+2)
	}
	flat := g.flat[:len(out)+2]
	j := 0
	for i, w := range bm {
		base := int32(lo + uint32(i)<<6)
		n := bits.OnesCount64(w)
		flat[j] = base + int32(bits.TrailingZeros64(w))
		w &= w - 1
		flat[j+1] = base + int32(bits.TrailingZeros64(w))
		if n > 2 {
			for k := j + 2; k < j+n; k++ {
				w &= w - 1
				flat[k] = base + int32(bits.TrailingZeros64(w))
			}
		}
		j += n
	}
	clear(bm)
	copy(out, flat)
	return j == len(out)
}
