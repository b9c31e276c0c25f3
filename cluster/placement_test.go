package cluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// nodesN returns n nodes "node-0".. with free pages each.
func nodesN(n int, free uint64) []NodeInfo {
	out := make([]NodeInfo, n)
	for i := range out {
		out[i] = NodeInfo{Name: fmt.Sprintf("node-%d", i), FreePages: free}
	}
	return out
}

// loads counts the ranks of each node.
func loads(ranks []string) map[string]int {
	l := map[string]int{}
	for _, r := range ranks {
		l[r]++
	}
	return l
}

func mustPlace(t *testing.T, nodes []NodeInfo, cp, tp int, coord string, need int) []string {
	t.Helper()
	ranks, err := PlaceGrid(nodes, cp, tp, coord, need)
	if err != nil {
		t.Fatalf("PlaceGrid(%v, cp %d, tp %d, %q, %d): %v", nodes, cp, tp, coord, need, err)
	}
	return ranks
}

// TestPlaceGridCoordinatorFirst: rank (0, 0) goes to the coordinator when
// it has room, whatever its hash.
func TestPlaceGridCoordinatorFirst(t *testing.T) {
	nodes := nodesN(5, 100)
	for _, n := range nodes {
		for _, g := range [][2]int{{1, 1}, {2, 1}, {1, 2}, {4, 2}, {3, 3}} {
			ranks := mustPlace(t, nodes, g[0], g[1], n.Name, 10)
			if ranks[0] != n.Name {
				t.Errorf("coordinator %s, grid %v: rank 0 on %s", n.Name, g, ranks[0])
			}
		}
	}
}

// TestPlaceGridDistinct: with at least as many nodes as ranks, every rank
// is on its own node.
func TestPlaceGridDistinct(t *testing.T) {
	for n := 1; n <= 8; n++ {
		for _, g := range [][2]int{{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 2}, {2, 4}, {8, 1}} {
			if g[0]*g[1] > n {
				continue
			}
			ranks := mustPlace(t, nodesN(n, 10), g[0], g[1], "node-0", 10)
			if l := loads(ranks); len(l) != len(ranks) {
				t.Errorf("%d nodes, grid %v: ranks %v share nodes", n, g, ranks)
			}
		}
	}
}

// TestPlaceGridEvenLoad: with fewer nodes than ranks, every node is used
// and the loads differ by at most one, round-robin in the same order.
func TestPlaceGridEvenLoad(t *testing.T) {
	for n := 1; n <= 5; n++ {
		for _, g := range [][2]int{{4, 2}, {3, 3}, {8, 1}, {1, 8}, {5, 3}} {
			r := g[0] * g[1]
			if r <= n {
				continue
			}
			ranks := mustPlace(t, nodesN(n, 1000), g[0], g[1], "node-1", 10)
			l := loads(ranks)
			lo, hi := r, 0
			for _, c := range l {
				lo, hi = min(lo, c), max(hi, c)
			}
			if len(l) != n || hi-lo > 1 {
				t.Errorf("%d nodes, grid %v: loads %v", n, g, l)
			}
			for i := n; i < r; i++ {
				if ranks[i] != ranks[i-n] {
					t.Errorf("%d nodes, grid %v: rank %d on %s, not round-robin (%v)", n, g, i, ranks[i], ranks)
				}
			}
		}
	}
}

// TestPlaceGridCapacity: a node hosts only the ranks its free pages hold;
// when the ranks do not fit, the error wraps ErrNoCapacity and says what
// was needed and the most free.
func TestPlaceGridCapacity(t *testing.T) {
	nodes := []NodeInfo{{"a", 50}, {"b", 100}, {"c", 250}, {"d", 99}}
	// The coordinator has no room: rank 0 goes elsewhere, a and d are
	// skipped.
	ranks := mustPlace(t, nodes, 2, 1, "a", 100)
	if slices.Contains(ranks, "a") || slices.Contains(ranks, "d") || ranks[0] == ranks[1] {
		t.Errorf("ranks %v: want b and c", ranks)
	}
	// c holds two ranks, b one: four ranks do not fit, three do.
	ranks = mustPlace(t, nodes, 3, 1, "c", 100)
	if l := loads(ranks); l["c"] != 2 || l["b"] != 1 || ranks[0] != "c" {
		t.Errorf("three ranks: %v", ranks)
	}
	_, err := PlaceGrid(nodes, 2, 2, "c", 100)
	if !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("four ranks: err %v, want ErrNoCapacity", err)
	}
	for _, w := range []string{"4 ranks of 100 pages", "room for 3", "most free on a node: 250 pages"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	// No nodes at all, or none with room.
	for _, ns := range [][]NodeInfo{nil, {{"a", 10}}} {
		if _, err := PlaceGrid(ns, 1, 1, "a", 11); !errors.Is(err, ErrNoCapacity) {
			t.Errorf("nodes %v: err %v, want ErrNoCapacity", ns, err)
		}
	}
	// need 0: any node hosts any number of ranks.
	if ranks := mustPlace(t, []NodeInfo{{"a", 0}}, 3, 1, "a", 0); !slices.Equal(ranks, []string{"a", "a", "a"}) {
		t.Errorf("need 0: %v", ranks)
	}
}

// TestPlaceGridSpread: different coordinators put their other ranks on
// different nodes: over 100 coordinators, every node of 4 gets rank 1 at
// least once (coordinators outside the nodes), and every node but the
// coordinator does (coordinators among them).
func TestPlaceGridSpread(t *testing.T) {
	nodes := nodesN(4, 100)
	got := map[string]int{}
	for i := range 100 {
		ranks := mustPlace(t, nodes, 2, 1, fmt.Sprintf("client-%d", i), 10)
		got[ranks[1]]++
	}
	for _, n := range nodes {
		if got[n.Name] == 0 {
			t.Errorf("outside coordinators: %s never gets rank 1 (%v)", n.Name, got)
		}
	}
	// Coordinators among the nodes (named so that 100 of them exist).
	nodes = nodesN(100, 100)
	sets := [][]NodeInfo{}
	for i := range 100 {
		sets = append(sets, []NodeInfo{nodes[i], nodes[(i+1)%100], nodes[(i+2)%100], nodes[(i+3)%100]})
	}
	first := map[int]int{} // offset of rank 1's node from the coordinator
	for i, set := range sets {
		ranks := mustPlace(t, set, 2, 1, set[0].Name, 10)
		for off, n := range set {
			if n.Name == ranks[1] {
				first[off]++
			}
		}
		if ranks[0] != set[0].Name {
			t.Errorf("set %d: rank 0 on %s", i, ranks[0])
		}
	}
	for off := 1; off < 4; off++ {
		if first[off] == 0 {
			t.Errorf("coordinators among the nodes: the node %d after the coordinator never gets rank 1 (%v)", off, first)
		}
	}
}

// TestPlaceGridBadInput: a bad grid, a negative need and bad node names
// are refused, and are not ErrNoCapacity.
func TestPlaceGridBadInput(t *testing.T) {
	nodes := nodesN(2, 10)
	for _, tc := range []struct {
		nodes    []NodeInfo
		cp, tp   int
		need     int
		contains string
	}{
		{nodes, 0, 1, 1, "cp and tp"},
		{nodes, 1, -1, 1, "cp and tp"},
		{nodes, 1 << 9, 1 << 9, 1, "ranks"},
		{nodes, 1, 1, -1, "need -1"},
		{[]NodeInfo{{"", 1}}, 1, 1, 1, "empty name"},
		{[]NodeInfo{{"a", 1}, {"a", 2}}, 1, 1, 1, `"a" listed twice`},
	} {
		_, err := PlaceGrid(tc.nodes, tc.cp, tc.tp, "a", tc.need)
		if err == nil || errors.Is(err, ErrNoCapacity) || !strings.Contains(err.Error(), tc.contains) {
			t.Errorf("%v cp %d tp %d need %d: err %v, want %q", tc.nodes, tc.cp, tc.tp, tc.need, err, tc.contains)
		}
	}
}

// TestPlaceGridProperties: over random node sets, grids, needs and
// coordinators, the answer does not depend on the order of the nodes, and
// every rule holds: room respected, coordinator first, distinct nodes
// while there are enough, loads even among the nodes with room left, and
// ErrNoCapacity exactly when the total room is short.
func TestPlaceGridProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 2000 {
		n := rng.IntN(9)
		nodes := make([]NodeInfo, n)
		for i := range nodes {
			nodes[i] = NodeInfo{Name: fmt.Sprintf("n%d-%d", iter%7, i), FreePages: uint64(rng.IntN(500))}
		}
		cp, tp, need := 1+rng.IntN(5), 1+rng.IntN(4), rng.IntN(200)
		coord := fmt.Sprintf("other-%d", rng.IntN(10))
		if n > 0 && rng.IntN(3) > 0 {
			coord = nodes[rng.IntN(n)].Name
		}
		ranks, err := PlaceGrid(nodes, cp, tp, coord, need)

		for range 3 {
			perm := slices.Clone(nodes)
			rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
			again, err2 := PlaceGrid(perm, cp, tp, coord, need)
			if !slices.Equal(again, ranks) || (err == nil) != (err2 == nil) {
				t.Fatalf("iter %d: order changes the answer: %v (%v) vs %v (%v)", iter, ranks, err, again, err2)
			}
		}

		r := cp * tp
		room := map[string]int{}
		total, eligible := 0, 0
		for _, nd := range nodes {
			k := r
			if need > 0 {
				k = min(r, int(nd.FreePages)/need)
			}
			room[nd.Name] = k
			total += k
			if k > 0 {
				eligible++
			}
		}
		if total < r {
			if !errors.Is(err, ErrNoCapacity) {
				t.Fatalf("iter %d: room for %d of %d ranks, err %v", iter, total, r, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("iter %d: room for %d of %d ranks: %v", iter, total, r, err)
		}
		if len(ranks) != r {
			t.Fatalf("iter %d: %d ranks, want %d", iter, len(ranks), r)
		}
		l := loads(ranks)
		hi := 0
		for name, c := range l {
			if c > room[name] {
				t.Errorf("iter %d: %s hosts %d ranks, room for %d", iter, name, c, room[name])
			}
			hi = max(hi, c)
		}
		if room[coord] > 0 && ranks[0] != coord {
			t.Errorf("iter %d: coordinator %s has room, rank 0 on %s", iter, coord, ranks[0])
		}
		if r <= eligible && len(l) != r {
			t.Errorf("iter %d: %d ranks on %d eligible nodes share nodes: %v", iter, r, eligible, ranks)
		}
		for name, k := range room {
			if k > l[name] && l[name] < hi-1 {
				t.Errorf("iter %d: %s has room but %d ranks, another has %d: %v", iter, name, l[name], hi, ranks)
			}
		}
	}
}

// TestNodesOf: the nodes of a view are the members up, with decoded meta
// and a gRPC address, with their free pages, in name order.
func TestNodesOf(t *testing.T) {
	meta := func(free uint64) NodeMeta {
		return NodeMeta{GRPCAddr: "127.0.0.1:7070", FreePages: free, TotalPages: 1000}
	}
	v := View{Version: 9, Members: []Member{
		{Name: "a", State: StateAlive, Meta: meta(10)},
		{Name: "b", State: StateSuspect, Meta: meta(20)},
		{Name: "c", State: StateDead, Meta: meta(30)},
		{Name: "d", State: StateLeft, Meta: meta(40)},
		{Name: "e", State: StateAlive, MetaErr: ErrInvalidMeta},
		{Name: "f", State: StateAlive, Meta: NodeMeta{FreePages: 5, TotalPages: 5}},
		{Name: "g", State: StateAlive, Meta: meta(0)},
	}}
	got := NodesOf(v)
	want := []NodeInfo{{"a", 10}, {"b", 20}, {"g", 0}}
	if !slices.Equal(got, want) {
		t.Errorf("NodesOf = %v, want %v", got, want)
	}
	if len(NodesOf(View{})) != 0 {
		t.Errorf("empty view has nodes")
	}
}

// ExamplePlaceGrid places a CP 2 x TP 2 grid coordinated by node-a on
// three nodes: rank 0 on the coordinator, the other ranks over the
// others, then round-robin.
func ExamplePlaceGrid() {
	nodes := []NodeInfo{{"node-c", 4096}, {"node-a", 4096}, {"node-b", 4096}}
	ranks, err := PlaceGrid(nodes, 2, 2, "node-a", 1024)
	if err != nil {
		fmt.Println(err)
		return
	}
	for t := range 2 {
		for c := range 2 {
			fmt.Printf("tp %d cp %d: %s\n", t, c, ranks[t*2+c])
		}
	}
	_, err = PlaceGrid(nodes, 8, 2, "node-a", 1024)
	fmt.Println(err)
	// Output:
	// tp 0 cp 0: node-a
	// tp 0 cp 1: node-c
	// tp 1 cp 0: node-b
	// tp 1 cp 1: node-a
	// cluster: place grid cp 8 x tp 2: no capacity: 16 ranks of 1024 pages each, room for 12 on 3 nodes (most free on a node: 4096 pages)
}

// TestRankPages: the most pages per rank that a number of ranks can
// reserve on nodes, by hand, and PlaceGrid's answer at that need and
// one page more.
func TestRankPages(t *testing.T) {
	three := []NodeInfo{{"a", 1000}, {"b", 700}, {"c", 300}}
	for _, c := range []struct {
		nodes []NodeInfo
		ranks int
		want  uint64
	}{
		{three, 1, 1000},
		{three, 2, 700},  // a 1 + b 1; at 701 only a
		{three, 3, 500},  // a 2 + b 1; at 501 a 1 + b 1
		{three, 4, 350},  // a 2 + b 2; at 351 a 2 + b 1
		{three, 6, 300},  // a 3 + b 2 + c 1; at 301 c holds none
		{three, 2000, 1}, // every free page a rank
		{three, 2001, 0}, // fewer free pages than ranks
		{[]NodeInfo{{"a", 4096}}, 3, 1365},
		{nil, 1, 0},
		{three, 0, 0},
	} {
		got := RankPages(c.nodes, c.ranks)
		if got != c.want {
			t.Errorf("RankPages(%v, %d) = %d, want %d", c.nodes, c.ranks, got, c.want)
		}
		if got == 0 || c.ranks < 1 {
			continue
		}
		if _, err := PlaceGrid(c.nodes, c.ranks, 1, "a", int(got)); err != nil {
			t.Errorf("%v: %d ranks of %d pages: %v", c.nodes, c.ranks, got, err)
		}
		if _, err := PlaceGrid(c.nodes, c.ranks, 1, "a", int(got)+1); !errors.Is(err, ErrNoCapacity) {
			t.Errorf("%v: %d ranks of %d pages: %v, want ErrNoCapacity", c.nodes, c.ranks, got+1, err)
		}
	}
}

// TestRankPagesGrids: grids placed one after another at RankPages of
// all their ranks all fit, each taking its ranks' pages from the nodes'
// free pages as the workers do, and one grid more does not.
func TestRankPagesGrids(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 29))
	for range 300 {
		nodes := nodesN(1+r.IntN(5), 0)
		for i := range nodes {
			nodes[i].FreePages = uint64(r.IntN(5000))
		}
		cp, tp, grids := 1+r.IntN(4), 1+r.IntN(2), 1+r.IntN(3)
		need := RankPages(nodes, cp*tp*grids)
		if need == 0 {
			continue
		}
		free := slices.Clone(nodes)
		for g := range grids + 1 {
			ranks, err := PlaceGrid(free, cp, tp, nodes[0].Name, int(need))
			if g == grids {
				if err == nil && RankPages(nodes, cp*tp*(grids+1)) < need {
					t.Errorf("%v: grid %d of cp %d x tp %d at %d pages placed past the bound", nodes, g, cp, tp, need)
				}
				break
			}
			if err != nil {
				t.Fatalf("%v: grid %d of %d (cp %d x tp %d) at %d pages: %v", nodes, g, grids, cp, tp, need, err)
			}
			for _, n := range ranks {
				i := slices.IndexFunc(free, func(f NodeInfo) bool { return f.Name == n })
				free[i].FreePages -= need
			}
		}
	}
}
