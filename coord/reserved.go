package coord

import (
	"reflect"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/engine"
)

// The pages this coordinator's own grids hold on the nodes: what serving
// adds back to the nodes' advertised free pages when it sizes grids of
// its own, and what placement counts as free for another sequence of a
// grid's config.

// LargestPool returns the largest pool per rank (Engine.CapacityPages)
// of this coordinator's open grids (those not lost) whose config keep
// accepts (nil: every one); 0 when there is none.
func (c *Coordinator) LargestPool(keep func(engine.Config) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	most := 0
	for _, g := range c.grids {
		if g.lost == nil && (keep == nil || keep(g.ec)) {
			most = max(most, g.ec.CapacityPages)
		}
	}
	return most
}

// Reserved returns the pages that this coordinator's open grids (those
// not lost) whose config keep accepts (nil: every one) reserve on each
// node: every rank's pool (Engine.CapacityPages) on the node placement
// put it on, by node name. A grid being opened is not counted yet, nor
// a lost one, whose nodes free its pools as they close it. The nodes'
// advertised free pages (cluster.NodeMeta.FreePages) leave these out,
// once their next metadata update is gossiped; a caller that sizes
// grids of its own adds them back (internal/serveengine).
func (c *Coordinator) Reserved(keep func(engine.Config) bool) map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reservedLocked(keep)
}

// reservedLocked is Reserved with c.mu held.
func (c *Coordinator) reservedLocked(keep func(engine.Config) bool) map[string]uint64 {
	out := map[string]uint64{}
	for _, g := range c.grids {
		if g.lost != nil || (keep != nil && !keep(g.ec)) {
			continue
		}
		for _, n := range g.nodes {
			out[n] += uint64(max(g.ec.CapacityPages, 0))
		}
	}
	return out
}

// withOwnLocked returns nodes with the pages that this coordinator's
// live grids of ec's worker config reserve added to their free pages
// (nodes itself when there are none; c.mu held).
func (c *Coordinator) withOwnLocked(nodes []cluster.NodeInfo, ec engine.Config) []cluster.NodeInfo {
	wc := ec.WorkerConfig()
	held := c.reservedLocked(func(g engine.Config) bool { return reflect.DeepEqual(g.WorkerConfig(), wc) })
	if len(held) == 0 {
		return nodes
	}
	out := make([]cluster.NodeInfo, len(nodes))
	for i, n := range nodes {
		n.FreePages += held[n.Name]
		out[i] = n
	}
	return out
}
