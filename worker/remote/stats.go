package remote

import (
	"slices"
	"time"
)

// Stats is a snapshot of a server's grids.
type Stats struct {
	// Grids and Ranks count the grids held (connected or not) and their
	// hosted ranks.
	Grids, Ranks int
	// PagesUsed is the pages the grids reserve; PagesFree what MaxPages
	// leaves (-1 without MaxPages).
	PagesUsed, PagesFree int
	// HostBytes is the host memory of the grids' pools and mirrors.
	HostBytes int64
	// PagesDevice and PagesHost are the pages in use in the connected
	// grids' hosted shards, summed over them: those whose K/V are in the
	// shard's device pool and those only in its host tier (offload, see
	// worker.Config.DeviceBudgetPages). Without offload every used page
	// is on the device.
	PagesDevice, PagesHost int
	// Offload sums the offload counters of the connected grids' hosted
	// offloading shards (cumulative while their grids stay open: a
	// grid's counters leave the sums when it closes).
	Offload OffloadTotals
	// Recovery counts what the grids recovered from ServerConfig.DataDir.
	Recovery RecoveryStats
	// Benches counts the collective benchmark ranks held: opened and
	// not yet run, or running (OpenBench, RunBench).
	Benches int
	// RanksPerDevice is the number of hosted ranks of the grids held on
	// each device (ServerConfig.Backends; one entry with a single
	// backend).
	RanksPerDevice []int
}

// OffloadTotals are offload counters summed over shards (see
// pagestore.ResidencyStats): pages step recalls found resident (Hits)
// or brought in (Misses), of them brought in by prefetch before a step
// wanted them (PrefetchHits), prefetched pages that left unused
// (PrefetchWasted), payload bytes into device pools (BytesIn, prefetch
// reads included) and out to tiers (BytesOut), pages evicted and those
// written back first, and the time steps spent in recalls.
type OffloadTotals struct {
	Hits, Misses, PrefetchHits, PrefetchWasted int64
	BytesIn, BytesOut                          int64
	Evictions, WriteBacks                      int64
	Stall                                      time.Duration
}

// Stats returns a snapshot (freeing grids whose ConnectGrid is overdue).
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep()
	s.benchOK()
	st := Stats{Grids: len(s.grids), PagesUsed: s.pages, PagesFree: -1, HostBytes: s.bytes, Recovery: s.rec, RanksPerDevice: slices.Clone(s.onDev), Benches: len(s.benches)}
	for _, g := range s.grids {
		st.Ranks += len(g.ranks)
		if g.local == nil {
			continue // not connected: no shards yet
		}
		st.Recovery.Parked += g.local.ParkedCount()
		for _, r := range g.local.Ranks() {
			sh := g.local.Shard(r)
			if sh == nil {
				continue
			}
			store := sh.Store()
			if store.Config().Offload() {
				rs := store.ResidencyStats()
				st.PagesDevice += rs.Resident
				st.PagesHost += rs.TierOnly
				o := &st.Offload
				o.Hits += rs.Hits
				o.Misses += rs.Misses
				o.PrefetchHits += rs.PrefetchHits
				o.PrefetchWasted += rs.PrefetchWasted
				o.BytesIn += rs.BytesIn + rs.PrefetchBytes
				o.BytesOut += rs.BytesOut
				o.Evictions += rs.Evictions
				o.WriteBacks += rs.WriteBacks
				o.Stall += rs.Stall
			} else {
				st.PagesDevice += store.Stats().UsedPages
			}
		}
	}
	if s.cfg.MaxPages > 0 {
		st.PagesFree = s.cfg.MaxPages - s.pages
	}
	return st
}

// Grids returns the number of grids held.
func (s *Server) Grids() int { return s.Stats().Grids }
