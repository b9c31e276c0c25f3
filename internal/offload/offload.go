// Package offload holds the offload settings of a grid, the one type
// that questd's configuration, engine.Config and worker.Config share
// (they embed it) and that travels to the workers in a GridConfig
// message: every rank of a grid offloads alike.
package offload

import "github.com/questrt/questrt/pagestore"

// Settings turns offload and prefetch on for every rank of a grid. The
// zero value is off (and LRU eviction, once on).
type Settings struct {
	// DeviceBudgetPages turns offload on for every rank: at most that
	// many pages' K/V per rank stay in its pool arrays (its device
	// memory with a device-resident backend), the others in a host
	// memory tier of the rank's own (see pagestore.Config.DeviceBudget),
	// in [0, capacity]. 0: off.
	DeviceBudgetPages int
	// Eviction is the offload eviction policy (pagestore.EvictLRU, the
	// zero value, or pagestore.EvictScore).
	Eviction pagestore.Eviction
	// PrefetchPages and PrefetchCrossLayer turn prefetch on for every
	// offloading rank (see shard.Config.PrefetchPages); 0 and false are
	// off. Prefetch needs DeviceBudgetPages > 0, and PrefetchCrossLayer
	// needs PrefetchPages > 0.
	PrefetchPages      int
	PrefetchCrossLayer bool
}
