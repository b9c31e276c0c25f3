package collective

import (
	"math"
	"slices"
)

// sortKeys sorts one row's sort keys ascending (Compare's order) and returns
// them: keys itself, or s's scratch holding them (keys then left in any
// order), which the caller copies where it wants them. It is the only
// sort of SelectExact: each member sorts its own candidates once, and the
// members merge the sorted lists.
//
// A comparison sort of a row of 128 keys makes about 900 comparisons, many
// of them mispredicted branches (slices.Sort: about 1 us on the 2-core dev
// machine, against 0.6 us here). sortKeys distributes the keys instead
// into n buckets by their score, linearly between the best and the worst
// score (a monotone map: a key before another never lands in a later
// bucket), then runs one insertion sort over the whole array, which only
// moves keys within their bucket: about one key per bucket for scores
// spread like attention scores. Buckets of more than maxBucket keys (many
// equal or clustered scores) are sorted by slices.Sort first, which bounds
// the insertion sort's work by n*maxBucket; rows whose scores all tie or
// whose range is not finite (an infinite score) go to slices.Sort whole.
//
// lo and hi are the smallest and largest score parts (key>>32) of keys.
// s holds the scratch, grown to the largest row seen.
func (s *keySorter) sortKeys(keys []uint64, lo, hi uint32) []uint64 {
	n := len(keys)
	if n < minBucketSort {
		slices.Sort(keys)
		return keys
	}
	top := float64(math.Float32frombits(keyScore(uint64(lo) << 32))) // best score
	span := top - float64(math.Float32frombits(keyScore(uint64(hi)<<32)))
	if !(span > 0) || math.IsInf(span, 0) {
		slices.Sort(keys)
		return keys
	}
	nb := n
	scale := float64(nb) / span
	if cap(s.tmp) < n {
		s.tmp = make([]uint64, n)
		s.bucket = make([]uint32, n)
	}
	if cap(s.cnt) < nb {
		s.cnt = make([]uint32, nb)
	}
	tmp, bucket, cnt := s.tmp[:n], s.bucket[:n], s.cnt[:nb]
	clear(cnt)
	for i, key := range keys {
		score := float64(math.Float32frombits(keyScore(key)))
		b := uint32(min(int((top-score)*scale), nb-1))
		bucket[i] = b
		cnt[b]++
	}
	// Exclusive prefix sums (cnt[b] becomes where bucket b starts), the
	// running sum in a register.
	sum, big := uint32(0), uint32(0)
	for i, c := range cnt {
		cnt[i] = sum
		sum += c
		big = max(big, c)
	}
	for i, key := range keys {
		b := bucket[i]
		tmp[cnt[b]] = key
		cnt[b]++
	}
	if big > maxBucket {
		// cnt[b] is now where bucket b ends.
		start := uint32(0)
		for _, end := range cnt[:nb] {
			if end-start > maxBucket {
				slices.Sort(tmp[start:end])
			}
			start = end
		}
	}
	insertionSort(tmp)
	return tmp
}

const (
	minBucketSort = 32 // shorter rows go to slices.Sort
	maxBucket     = 16 // larger buckets are sorted before the insertion sort
)

// keySorter holds sortKeys' scratch.
type keySorter struct {
	tmp    []uint64
	bucket []uint32
	cnt    []uint32
}

// insertionSort sorts a ascending; it is fast when every key is near its
// place.
func insertionSort(a []uint64) {
	for i := 1; i < len(a); i++ {
		x := a[i]
		j := i
		for ; j > 0 && a[j-1] > x; j-- {
			a[j] = a[j-1]
		}
		a[j] = x
	}
}
