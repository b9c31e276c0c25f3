package collective

import (
	"math"
	"slices"
)

// sortKeys writes one row's sort keys, keys, to dst (of the same length)
// in ascending order (Compare's order); keys is left as it was. It
// reports whether dst ascends strictly (no key given twice), which its
// last pass finds without another pass over the row. It is the only sort
// of SelectExact: each member sorts its own candidates once, and the
// members merge the sorted lists.
//
// A comparison sort of a row of 128 keys makes about 900 comparisons, many
// of them mispredicted branches. sortKeys distributes the keys instead
// into n buckets by their score, linearly between the best and the worst
// score (a monotone map: a key before another never lands in a later
// bucket), then runs one insertion sort over the whole array, which only
// moves keys within their bucket: about one key per bucket for scores
// spread like attention scores. Buckets of more than maxBucket keys (many
// equal or clustered scores) are sorted by slices.Sort first, which bounds
// the insertion sort's work by n*maxBucket; rows whose scores all tie or
// whose range is not finite (an infinite score) go to slices.Sort whole.
//
// The counting pass notes each key's place in its bucket, so the scatter
// reads the bucket starts without updating them (an update whose result
// addresses the next store stalls on keys that share a bucket), and the
// insertion sort is branch-free where a key is at most one place from
// home (insertionSort).
//
// lo and hi are the smallest and largest score parts (key>>32) of keys.
// s holds the scratch, grown to the largest row seen.
func (s *keySorter) sortKeys(dst, keys []uint64, lo, hi uint32) (strict bool) {
	n := len(keys)
	dst = dst[:n]
	if n < minBucketSort {
		copy(dst, keys)
		slices.Sort(dst)
		return strictlyAscending(dst)
	}
	top := float64(math.Float32frombits(keyScore(uint64(lo) << 32))) // best score
	span := top - float64(math.Float32frombits(keyScore(uint64(hi)<<32)))
	if !(span > 0) || math.IsInf(span, 0) {
		copy(dst, keys)
		slices.Sort(dst)
		return strictlyAscending(dst)
	}
	nb := n
	scale := float64(nb) / span
	if cap(s.bucket) < n {
		s.bucket = make([]uint32, n)
		s.off = make([]uint32, n)
	}
	if cap(s.start) < nb {
		s.start = make([]uint32, nb)
	}
	bucket, off, start := s.bucket[:n], s.off[:n], s.start[:nb]
	clear(start)
	for i, key := range keys {
		score := float64(math.Float32frombits(keyScore(key)))
		b := uint32(min(int((top-score)*scale), nb-1))
		bucket[i] = b
		off[i] = start[b] // the key's place in its bucket
		start[b]++
	}
	// Exclusive prefix sums (start[b] becomes where bucket b starts), the
	// running sum in a register.
	sum, big := uint32(0), uint32(0)
	for i, c := range start {
		start[i] = sum
		sum += c
		big = max(big, c)
	}
	for i, key := range keys {
		dst[start[bucket[i]]+off[i]] = key
	}
	if big > maxBucket {
		for b, from := range start {
			to := uint32(n)
			if b+1 < nb {
				to = start[b+1]
			}
			if to-from > maxBucket {
				slices.Sort(dst[from:to])
			}
		}
	}
	return insertionSort(dst)
}

const (
	minBucketSort = 32 // shorter rows go to slices.Sort
	maxBucket     = 16 // larger buckets are sorted before the insertion sort
)

// keySorter holds sortKeys' scratch.
type keySorter struct {
	bucket []uint32 // per key: its bucket
	off    []uint32 // per key: its place among its bucket's keys
	start  []uint32 // per bucket: its count, then where it starts
}

// insertionSort sorts a ascending and reports whether it then ascends
// strictly; it is fast when every key is near its place. Each key is
// first swapped with the one before it by min and max (conditional moves,
// no branch): after a bucket scatter that finishes most keys, and the
// branch that looks further back is taken only for the few keys that sit
// two or more places from home.
//
// Two equal keys end up next to each other when the later one is
// inserted, so the smallest gap between a key and its neighbours at its
// insertion is 0 exactly when a key is there twice: that gap is kept by
// min (no branch) instead of a second pass over the row.
func insertionSort(a []uint64) (strict bool) {
	if len(a) < 2 {
		return true
	}
	// p2, p1: a[i-2] and a[i-1], the largest key so far.
	p2, p1 := min(a[0], a[1]), max(a[0], a[1])
	a[0], a[1] = p2, p1
	gap := p1 - p2
	for i := 2; i < len(a); i++ {
		x := a[i]
		lo, hi := min(x, p1), max(x, p1)
		a[i-1], a[i] = lo, hi
		// lo - p2 wraps to a nonzero value when p2 > lo: the branch
		// below then checks lo's place.
		gap = min(gap, hi-lo, lo-p2)
		if p2 > lo {
			// lo belongs further back: shift the larger keys up (each
			// above lo, so only the key it stops at can equal lo).
			j := i - 1
			for ; j > 0 && a[j-1] > lo; j-- {
				a[j] = a[j-1]
			}
			a[j] = lo
			if j > 0 && a[j-1] == lo {
				gap = 0
			}
			lo = a[i-1]
		}
		p2, p1 = lo, hi
	}
	return gap != 0
}
