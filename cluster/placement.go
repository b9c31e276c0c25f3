package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
)

// NodeInfo is what placement knows about a node: its name and the pages
// it can still host (summed over its devices).
type NodeInfo struct {
	Name      string
	FreePages uint64
}

// ErrNoCapacity means the ranks of a grid do not fit the free pages of
// the nodes: the error says how many pages a rank needs and the most free
// on any node.
var ErrNoCapacity = errors.New("no capacity")

// maxGridRanks bounds cp x tp in [PlaceGrid].
const maxGridRanks = 1 << 16

// NodesOf returns the nodes of v that placement may use: the members that
// are up (alive or suspect, the ones [View.Digest] covers, so that nodes
// whose views agree place alike), whose metadata decoded and that serve
// gRPC, with their free pages. They are sorted by name, as in v.
func NodesOf(v View) []NodeInfo {
	var out []NodeInfo
	for _, m := range v.Members {
		if !m.State.Up() || m.MetaErr != nil || m.Meta.GRPCAddr == "" {
			continue
		}
		out = append(out, NodeInfo{Name: m.Name, FreePages: m.Meta.FreePages})
	}
	return out
}

// PlaceGrid chooses the node of every rank of a cp x tp grid whose ranks
// need need pages each, and returns their names: ranks[t*cp+c] hosts TP
// rank t, CP rank c. It is a pure function of its arguments, whatever the
// order of nodes:
//
//   - A node is eligible for as many ranks as its free pages hold
//     (FreePages / need; any number when need is 0).
//   - The nodes are ordered by rendezvous hashing: the coordinator first
//     (when it is one of nodes), then the others by a hash of the
//     coordinator's name and theirs, so that the grids of different
//     coordinators spread over different nodes; ties go by name.
//   - Ranks go round-robin over that order in rank order, skipping a node
//     whose room is used up: rank (0, 0), which receives the merged
//     outputs, goes to the coordinator when it has room; the ranks land on
//     distinct nodes while there are enough, and otherwise the load of the
//     nodes with room differs by at most one rank.
//
// It fails with an error wrapping [ErrNoCapacity] when the nodes cannot
// hold every rank, and with another error for a bad grid, a negative
// need, or a node name that is empty or repeated.
func PlaceGrid(nodes []NodeInfo, cp, tp int, coordinator string, need int) ([]string, error) {
	if cp < 1 || tp < 1 || cp > maxGridRanks || tp > maxGridRanks || cp*tp > maxGridRanks {
		return nil, fmt.Errorf("cluster: place grid cp %d x tp %d: want 1 to %d ranks, cp and tp at least 1", cp, tp, maxGridRanks)
	}
	if need < 0 {
		return nil, fmt.Errorf("cluster: place grid cp %d x tp %d: need %d pages per rank < 0", cp, tp, need)
	}
	order := make([]ranked, 0, len(nodes))
	seen := make(map[string]bool, len(nodes))
	var most uint64
	for _, n := range nodes {
		if n.Name == "" {
			return nil, fmt.Errorf("cluster: place grid cp %d x tp %d: a node has an empty name", cp, tp)
		}
		if seen[n.Name] {
			return nil, fmt.Errorf("cluster: place grid cp %d x tp %d: node %q listed twice", cp, tp, n.Name)
		}
		seen[n.Name] = true
		most = max(most, n.FreePages)
		room := uint64(maxGridRanks)
		if need > 0 {
			room = min(room, n.FreePages/uint64(need))
		}
		if room == 0 {
			continue
		}
		order = append(order, ranked{name: n.Name, room: int(room), coord: n.Name == coordinator, score: rendezvous(coordinator, n.Name)})
	}
	slices.SortFunc(order, func(a, b ranked) int {
		switch {
		case a.coord != b.coord:
			if a.coord {
				return -1
			}
			return 1
		case a.score != b.score:
			return cmp.Compare(b.score, a.score) // highest first
		}
		return cmp.Compare(a.name, b.name)
	})

	ranks := make([]string, cp*tp)
	placed := 0
	for placed < len(ranks) {
		before := placed
		for i := range order {
			if placed == len(ranks) {
				break
			}
			if order[i].room == 0 {
				continue
			}
			order[i].room--
			ranks[placed] = order[i].name
			placed++
		}
		if placed == before {
			return nil, fmt.Errorf("cluster: place grid cp %d x tp %d: %w: %d ranks of %d pages each, room for %d on %d nodes (most free on a node: %d pages)",
				cp, tp, ErrNoCapacity, len(ranks), need, placed, len(nodes), most)
		}
	}
	return ranks, nil
}

// ranked is a node eligible for placement, with its rendezvous score and
// the ranks it still has room for.
type ranked struct {
	name  string
	room  int
	coord bool
	score uint64
}

// rendezvous is the score of node for coordinator's grids: FNV-1a 64 of
// both names (with a separator), then a 64-bit finalizer (murmur3's
// fmix64) so that names differing in their last bytes still rank
// independently.
func rendezvous(coordinator, node string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(coordinator))
	h.Write([]byte{0})
	h.Write([]byte(node))
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// RankPages returns the most pages that each of ranks ranks of equal
// size can reserve with all of them placed on nodes: the largest need
// for which [PlaceGrid]'s rule (a node hosts FreePages / need ranks)
// leaves room for ranks ranks, so that PlaceGrid of any grid of that
// many ranks at that need succeeds on nodes. It is 0 when the nodes'
// free pages are fewer than ranks or ranks < 1.
//
// Ranks of equal need use up whole slots of a node, so the ranks of
// several grids fit one after another exactly when their sum fits at
// once (placing k ranks on a node of s slots leaves s - k): ranks may
// count the ranks of every grid that will be placed at that need.
func RankPages(nodes []NodeInfo, ranks int) uint64 {
	if ranks < 1 {
		return 0
	}
	fits := func(need uint64) bool {
		n := uint64(0)
		for _, node := range nodes {
			if n += node.FreePages / need; n >= uint64(ranks) {
				return true
			}
		}
		return false
	}
	var most uint64
	for _, n := range nodes {
		most = max(most, n.FreePages)
	}
	// The largest need in [1, most] that fits (fits is monotone: a
	// larger need leaves no more slots on any node).
	lo, hi := uint64(0), most
	for lo < hi {
		mid := hi - (hi-lo)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
