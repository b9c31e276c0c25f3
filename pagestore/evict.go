package pagestore

import (
	"fmt"
	"math"
)

// Eviction names the policy that picks which resident page leaves the
// device pool when a page needs a slot (see [Config.DeviceBudget]).
type Eviction int

const (
	// EvictLRU evicts the least recently used page (the zero value and the
	// default): a page is used when a step attends it or an append writes
	// it.
	EvictLRU Eviction = iota
	// EvictScore evicts the page with the lowest recent selection
	// frequency: an exponentially decayed count per page (decay
	// [Config.ScoreDecay] per step recall, one added each time a step
	// attends it); ties go to the least recently used. The count survives
	// an eviction (a page that keeps being selected comes back valued)
	// and is cleared when the page is recycled.
	EvictScore
)

// String returns "lru" or "score".
func (e Eviction) String() string {
	switch e {
	case EvictLRU:
		return "lru"
	case EvictScore:
		return "score"
	}
	return fmt.Sprintf("Eviction(%d)", int(e))
}

// ParseEviction parses "lru" or "score" ("" means lru).
func ParseEviction(s string) (Eviction, error) {
	switch s {
	case "", "lru":
		return EvictLRU, nil
	case "score":
		return EvictScore, nil
	}
	return 0, fmt.Errorf("%w: unknown eviction policy %q (want lru or score)", ErrInvalidConfig, s)
}

// Evictor orders the resident pages of a store for eviction. The store
// calls it only with its residency lock held, so implementations need no
// locking of their own and must not call back into the store. Ticks count
// the store's step recalls and never decrease.
type Evictor interface {
	// Admit records that page p got a device slot at tick now.
	Admit(p int32, now uint64)
	// Touch records that a step used resident page p at tick now.
	Touch(p int32, now uint64)
	// Remove records that page p left the device; freed says the page was
	// recycled (its history ends).
	Remove(p int32, freed bool)
	// Victim returns the resident page to evict first among those e
	// accepts, or -1 when e accepts none.
	Victim(e Eligible) int32
}

// Eligible says which resident pages an eviction may take (unpinned pages
// that the operation in progress does not need).
type Eligible interface {
	Evictable(p int32) bool
}

// NewEvictor returns the evictor of policy e for a pool of capacity
// pages; decay is the per-tick decay of EvictScore (ignored by EvictLRU).
func NewEvictor(e Eviction, capacity int, decay float64) (Evictor, error) {
	switch e {
	case EvictLRU:
		return newLRU(capacity), nil
	case EvictScore:
		if !(decay > 0 && decay < 1) {
			return nil, fmt.Errorf("%w: score decay %v not in (0, 1)", ErrInvalidConfig, decay)
		}
		return &scoreEvictor{lru: *newLRU(capacity), lambda: -math.Log(decay),
			logCount: make([]float64, capacity), last: make([]uint64, capacity), has: make([]bool, capacity)}, nil
	}
	return nil, fmt.Errorf("%w: unknown eviction policy %d", ErrInvalidConfig, int(e))
}

// lru orders the resident pages by their last use (Admit or Touch), as a
// move-to-front list would, at O(1) per use and no pointer chasing: each
// use stamps the page with the next value of a counter and appends (page,
// stamp) to a queue. An entry is current while its stamp is the page's, so
// the current entries, front to back, are the resident pages from least to
// most recently used. Victim pops stale entries off the front; the queue
// is compacted when stale entries outnumber the current ones.
type lru struct {
	stamp []uint64 // page -> stamp of its last use; 0: not resident
	q     []lruUse
	head  int    // q[:head] is consumed
	live  int    // pages with a stamp (current entries)
	clock uint64 // the last stamp given
	skip  []lruUse
}

// lruUse is one use of a page in the lru queue.
type lruUse struct {
	p     int32
	stamp uint64
}

func newLRU(capacity int) *lru {
	return &lru{stamp: make([]uint64, capacity)}
}

// current reports whether u is page u.p's last use (and u.p resident).
func (l *lru) current(u lruUse) bool { return l.stamp[u.p] == u.stamp }

// use makes p the most recently used page.
func (l *lru) use(p int32) {
	if l.stamp[p] == 0 {
		l.live++
	}
	l.clock++
	l.stamp[p] = l.clock
	if n := len(l.q) - l.head; n >= 64 && n > 2*l.live {
		l.compact()
	}
	l.q = append(l.q, lruUse{p, l.clock})
}

// compact drops the stale entries, keeping the current ones in order.
func (l *lru) compact() {
	q := l.q[:0]
	for _, u := range l.q[l.head:] {
		if l.current(u) {
			q = append(q, u)
		}
	}
	l.q, l.head = q, 0
}

func (l *lru) Admit(p int32, _ uint64) { l.use(p) }

func (l *lru) Touch(p int32, _ uint64) { l.use(p) }

func (l *lru) Remove(p int32, _ bool) {
	if l.stamp[p] != 0 {
		l.stamp[p] = 0
		l.live--
	}
}

// Victim returns the least recently used page that e accepts. The
// entries it passes over (stale ones, and current ones e refuses) are
// squeezed out of the front: the refused ones move, in order, to just
// before the victim's entry, which stays (the caller may keep the page).
func (l *lru) Victim(e Eligible) int32 {
	l.skip = l.skip[:0]
	for i := l.head; i < len(l.q); i++ {
		u := l.q[i]
		if !l.current(u) {
			continue
		}
		if !e.Evictable(u.p) {
			l.skip = append(l.skip, u)
			continue
		}
		l.head = i - len(l.skip)
		copy(l.q[l.head:i], l.skip)
		return u.p
	}
	return -1
}

// scoreEvictor keeps, per page, the log of its decayed use count at its
// last use and the tick of that use. The count at tick t is
// c*exp(-lambda*(t-last)), so pages rank by the time-invariant key
// log(c) + lambda*last (compared without an exp per candidate).
type scoreEvictor struct {
	lru      // resident pages, for iteration and recency ties
	lambda   float64
	logCount []float64 // log of the count at the last use
	last     []uint64  // tick of the last use
	has      []bool    // the page has a history (used since it was last recycled)
}

func (s *scoreEvictor) use(p int32, now uint64) {
	c := 1.0
	if s.has[p] {
		c += math.Exp(s.logCount[p] - s.lambda*float64(now-s.last[p]))
	}
	s.logCount[p], s.last[p], s.has[p] = math.Log(c), now, true
}

func (s *scoreEvictor) key(p int32) float64 {
	if !s.has[p] {
		return math.Inf(-1)
	}
	return s.logCount[p] + s.lambda*float64(s.last[p])
}

// Admit counts as a use: a page just written or recalled is as valuable as
// one selected once now.
func (s *scoreEvictor) Admit(p int32, now uint64) { s.lru.Admit(p, now); s.use(p, now) }

func (s *scoreEvictor) Touch(p int32, now uint64) { s.lru.Touch(p, now); s.use(p, now) }

func (s *scoreEvictor) Remove(p int32, freed bool) {
	s.lru.Remove(p, freed)
	if freed {
		s.has[p] = false
	}
}

func (s *scoreEvictor) Victim(e Eligible) int32 {
	best, bestKey := int32(-1), math.Inf(1)
	// From the least recently used: a strict < keeps the older of equals.
	for _, u := range s.q[s.head:] {
		if !s.current(u) {
			continue
		}
		if k := s.key(u.p); k < bestKey && e.Evictable(u.p) {
			best, bestKey = u.p, k
		}
	}
	return best
}
