package completion

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/questrt/questrt/model"
)

// prefixKey names one full page of a prompt and every page before it:
// sha256 of the previous page's key and this page's token ids (the
// chain of vLLM's automatic prefix caching), so equal keys mean equal
// prefixes.
type prefixKey [sha256.Size]byte

// prefixKeys returns the keys of the full pages of ids, at most max
// (page size ps).
func prefixKeys(ids []int, ps, max int) []prefixKey {
	n := min(len(ids)/ps, max)
	keys := make([]prefixKey, n)
	var prev prefixKey
	buf := make([]byte, 0, len(prev)+4*ps)
	for p := range n {
		buf = append(buf[:0], prev[:]...)
		for _, id := range ids[p*ps : (p+1)*ps] {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(id))
		}
		prev = sha256.Sum256(buf)
		keys[p] = prev
	}
	return keys
}

// prefixEntry is one cached prefix: a sequence of the main engine (or,
// on a cluster, of the serving policy's grid) holding the first pages
// of a prompt (page-aligned, so every page is
// sealed and shared with the requests that fork it, summaries
// included), and, when a CPU prefill recorded them, the prefix's
// float32 keys and values, over which the CPU prefill of a later
// prompt's suffix attends.
type prefixEntry struct {
	attn *model.EngineAttention
	kv   model.KVSource // nil for a prefix prefilled on the device
	ids  []int          // the prefix's tokens (len(keys) pages)
	keys []prefixKey
	// owned counts the keys that map to this entry (a later entry
	// holding the same pages takes them over; at 0 it is dropped).
	owned int
	// base is the live entry whose first shared pages this one shares
	// physically (it was forked from them), nil for none.
	base   *prefixEntry
	shared int
	used   uint64 // LRU tick
	gone   bool
}

// prefixCache is the server's prefix cache (Config.PrefixCaching): the
// scheduler goroutine's alone.
type prefixCache struct {
	ps, cp int
	max    int // pages per shard at most (0: the pool's bound only)
	byKey  map[prefixKey]*prefixEntry
	live   []*prefixEntry
	tick   uint64
}

func newPrefixCache(ps, cp, max int) *prefixCache {
	return &prefixCache{ps: ps, cp: cp, max: max, byKey: map[prefixKey]*prefixEntry{}}
}

// own is the pages per shard e holds that no live entry before it
// holds: an upper bound over the CP shards of its striped pages.
func (c *prefixCache) own(e *prefixEntry) int {
	return (len(e.keys) - e.shared + c.cp - 1) / c.cp
}

// pages is the pages per shard the cache holds (counted from above:
// pages that running requests share count here and in their
// reservation both).
func (c *prefixCache) pages() int {
	n := 0
	for _, e := range c.live {
		n += c.own(e)
	}
	return n
}

// lookup returns the entry holding the longest cached prefix of ids
// that leaves at least one token to prefill, and its pages (0: none).
func (c *prefixCache) lookup(ids []int) (*prefixEntry, int) {
	keys := prefixKeys(ids, c.ps, (len(ids)-1)/c.ps)
	m := 0
	for m < len(keys) && c.byKey[keys[m]] != nil {
		m++
	}
	if m == 0 {
		return nil, 0
	}
	e := c.byKey[keys[m-1]]
	if !slices.Equal(e.ids[:m*c.ps], ids[:m*c.ps]) {
		return nil, 0 // a sha256 collision: never seen, never trusted
	}
	c.tick++
	e.used = c.tick
	return e, m
}

// insert caches the full pages of ids (at most the bound's), held by
// attn (which holds ids, on the main engine) and, from a CPU prefill,
// kv; from is the entry attn's first fromPages pages were forked from
// (nil: none). It returns the entries to release (replaced, or evicted
// to keep the bound: evicted counts the pages of the latter), which it
// has already taken out of the cache.
func (c *prefixCache) insert(ids []int, attn *model.EngineAttention, kv model.KVSource, from *prefixEntry, fromPages int) (added bool, drop []*prefixEntry, evicted int, err error) {
	limit := len(ids) / c.ps
	if c.max > 0 {
		limit = min(limit, c.max*c.cp)
	}
	keys := prefixKeys(ids, c.ps, limit)
	if len(keys) == 0 {
		return false, nil, 0, nil
	}
	c.tick++
	if e := c.byKey[keys[len(keys)-1]]; e != nil {
		e.used = c.tick // cached already
		return false, nil, 0, nil
	}
	a, err := attn.ForkPrefix(len(keys) * c.ps)
	if err != nil {
		return false, nil, 0, err
	}
	e := &prefixEntry{attn: a, kv: kv, ids: slices.Clone(ids[:len(keys)*c.ps]), keys: keys, used: c.tick}
	for from != nil && from.gone {
		fromPages = min(fromPages, from.shared)
		from = from.base
	}
	if from != nil {
		e.base, e.shared = from, min(fromPages, len(keys))
	}
	c.live = append(c.live, e)
	for _, k := range keys {
		if old := c.byKey[k]; old != nil {
			old.owned--
			if old.owned == 0 {
				c.remove(old)
				drop = append(drop, old)
			}
		}
		c.byKey[k] = e
		e.owned++
	}
	for c.max > 0 && c.pages() > c.max {
		v := c.lru()
		evicted += c.own(v)
		c.remove(v)
		drop = append(drop, v)
	}
	return true, drop, evicted, nil
}

// lru returns the least recently used live entry (nil: none).
func (c *prefixCache) lru() *prefixEntry {
	var v *prefixEntry
	for _, e := range c.live {
		if v == nil || e.used < v.used {
			v = e
		}
	}
	return v
}

// evict takes least recently used entries out until the cache holds at
// most pages pages per shard; it returns them (to release) and the
// pages they held.
func (c *prefixCache) evict(pages int) (drop []*prefixEntry, evicted int) {
	for len(c.live) > 0 && c.pages() > pages {
		v := c.lru()
		evicted += c.own(v)
		c.remove(v)
		drop = append(drop, v)
	}
	return drop, evicted
}

// remove takes e out of the cache (the caller releases its sequence):
// its keys, and the entries that shared its pages now share those of
// its base that they held through it.
func (c *prefixCache) remove(e *prefixEntry) {
	for _, k := range e.keys {
		if c.byKey[k] == e {
			delete(c.byKey, k)
		}
	}
	e.gone = true
	c.live = slices.DeleteFunc(c.live, func(x *prefixEntry) bool { return x == e })
	for _, x := range c.live {
		if x.base == e {
			x.base, x.shared = e.base, min(x.shared, e.shared)
		}
	}
}

// cacheable reports whether j's prompt may use and fill the prefix
// cache: on the main engine (an own engine's pages are not the main
// one's), or on a cluster on the grid of the serving policy (a grid of
// a request's own options holds other pages).
func (s *Server) cacheable(j *job) bool {
	return s.pc != nil && !j.p.own
}

// prefixHit starts j's prefill from the longest cached prefix of its
// prompt, when there is one it can use (onDevice: a device prefill;
// else a CPU prefill, which needs the prefix's float32 keys and values;
// all: every position's logits, which the cache does not hold): j gets a
// fork of the prefix (j.pre on the device, j.base with a dense recorder
// starting from the prefix's keys on the CPU; on a cluster the fork is
// a sequence on the entry's grid, its pages and summaries shared on
// every rank). It looks once per prefill (j.probed). It reports a
// failure to fork (j ends), but for an entry whose grid is lost: the
// lost grid's entries leave the cache and j prefills from the start.
func (s *Server) prefixHit(j *job, onDevice, all bool) error {
	if !s.cacheable(j) || all || j.filled != 0 || j.probed {
		return nil
	}
	j.probed = true
	e, m := s.pc.lookup(j.p.ids)
	if e != nil && !onDevice && e.kv == nil {
		e, m = nil, 0
	}
	var a *model.EngineAttention
	if m > 0 {
		var err error
		if a, err = e.attn.ForkPrefix(m * s.pc.ps); err != nil {
			if !errors.Is(err, ErrGridLost) {
				return fmt.Errorf("fork the cached prefix: %w", err)
			}
			s.log.Warn("prefix cache: the cached prefix's grid is lost; prefilling the whole prompt", "request", j.id, "err", err)
			s.dropLost()
			e, m = nil, 0
		}
	}
	s.count(func(st *Stats) {
		st.PrefixCacheQueryTokens += uint64(len(j.p.ids))
		if m == 0 {
			st.PrefixCacheMisses++
		} else {
			st.PrefixCacheHits++
			st.PrefixCacheHitTokens += uint64(m * s.pc.ps)
		}
	})
	if m == 0 {
		return nil
	}
	tokens := m * s.pc.ps
	a.Budget = j.p.budget
	s.main.acquire()
	j.eng = s.main
	ja := &jobAttention{EngineAttention: a, denseLayers: j.p.denseLayers, allDense: j.p.allDense}
	if onDevice {
		j.pre = ja
	} else {
		j.base = ja
		j.dense = model.NewDenseFrom(s.m.Geometry(), s.cfg.Workers, e.kv, tokens)
	}
	j.filled, j.cached, j.from = tokens, tokens, e
	return nil
}

// remember caches the full pages of j's prompt, loaded into j.attn
// (kv: the CPU prefill's keys and values, nil for a device prefill). A
// failure only leaves the prompt out of the cache.
func (s *Server) remember(j *job, kv model.KVSource) {
	if !s.cacheable(j) {
		return
	}
	fromPages := 0
	if j.from != nil {
		fromPages = j.cached / s.pc.ps
	}
	added, drop, evicted, err := s.pc.insert(j.p.ids, j.attn.EngineAttention, kv, j.from, fromPages)
	j.from = nil
	if err != nil {
		s.log.Warn("prefix cache: keep the prompt's pages", "request", j.id, "err", err)
		return
	}
	if added {
		s.main.acquire() // the entry's sequence
	}
	s.dropPrefixes(drop, evicted)
}

// dropLost takes out of the cache the entries whose grid is lost (a
// cluster's: a node of it killed, restarted or unreachable), whose
// pages went with the grid, and releases their sequences (which frees
// the coordinator's record of them only). A request run again after the
// loss (Config.GridRetries) thus never forks a dead grid's prefix.
func (s *Server) dropLost() {
	if s.pc == nil {
		return
	}
	var drop []*prefixEntry
	for _, e := range slices.Clone(s.pc.live) {
		if g, ok := e.attn.Sequence().(gridLoser); ok && g.GridLost() {
			s.pc.remove(e)
			drop = append(drop, e)
		}
	}
	if len(drop) == 0 {
		return
	}
	s.log.Warn("prefix cache: dropping the prefixes of a lost grid", "entries", len(drop))
	s.count(func(st *Stats) { st.PrefixCacheLost += uint64(len(drop)) })
	s.dropPrefixes(drop, 0)
}

// evictPrefixes gives way to a request of pages pages per shard that
// does not fit beside the reserved ones and the cache's: least recently
// used entries leave until it fits or the cache is empty. Called under
// s.mu; it returns the entries to release once s.mu is unlocked.
func (s *Server) evictPrefixes(pages int) []*prefixEntry {
	if s.pc == nil {
		return nil
	}
	room := s.capacity() - s.reserved - pages
	if s.pc.pages() <= room {
		return nil
	}
	drop, evicted := s.pc.evict(max(room, 0))
	s.stats.PrefixCacheEvictedPages += uint64(evicted)
	return drop
}

// dropPrefixes releases the sequences of entries out of the cache (evicted
// counts the pages evicted among them) and updates the gauges.
func (s *Server) dropPrefixes(drop []*prefixEntry, evicted int) {
	for _, e := range drop {
		if err := e.attn.Release(); err != nil {
			s.log.Warn("prefix cache: release a prefix", "err", err)
		}
		s.main.release()
	}
	s.count(func(st *Stats) {
		st.PrefixCacheEvictedPages += uint64(evicted)
		st.PrefixCacheEntries, st.PrefixCachePages = len(s.pc.live), s.pc.pages()
	})
}
