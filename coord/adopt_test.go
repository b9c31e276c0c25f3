package coord_test

import (
	"context"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// copyTree copies the files under src to dst: what a kill -9 of the
// process leaves on disk, taken while the nodes are quiet.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAdoptAcrossNodes: a CP = 2 sequence over two persisting nodes
// takes appends and a decode step, then both nodes crash (their data
// directories as a kill -9 leaves them: sealed pages only). Restarted
// under the same names, the coordinator adopts the sequence under its
// old id: node 0 kept pages up to a longer length than node 1 (node 1
// lost the tail page) and is rolled back to node 1's; the lost tokens
// are exact. A sequence only one node persisted is dropped on the
// other and reported damaged. After the client re-appends the lost
// tokens, the next steps equal, bit for bit, those of a cluster that
// never stopped; after the release no page is in use.
func TestAdoptAcrossNodes(t *testing.T) {
	ec := geometry(2, 1)
	dirs := []string{t.TempDir(), t.TempDir()}
	persist := func(dirs []string) func(int, *node.Config) {
		return func(i int, c *node.Config) { c.DataDir = dirs[i] }
	}
	nodes := nodetest.Start(t, "n", 2, ec, persist(dirs))
	refNodes := startCluster(t, 2, ec)
	c, ref := dial(t, nodes[0]), dial(t, refNodes[0])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(9, 9))
	kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
	hist := make([][2][]float32, ec.Layers)
	create := func(c *client.Client) string {
		t.Helper()
		id, _, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	seq, rseq := create(c), create(ref)
	appendBoth := func(n int) {
		t.Helper()
		for l := range ec.Layers {
			k, v := randVec(rng, n*kv), randVec(rng, n*kv)
			if err := c.Append(ctx, seq, l, k, v); err != nil {
				t.Fatal(err)
			}
			if err := ref.Append(ctx, rseq, l, k, v); err != nil {
				t.Fatal(err)
			}
			hist[l][0], hist[l][1] = append(hist[l][0], k...), append(hist[l][1], v...)
		}
	}
	step := func() {
		t.Helper()
		for l := range ec.Layers {
			q, k, v := randVec(rng, qd), randVec(rng, kv), randVec(rng, kv)
			got, err := c.Step(ctx, l, []client.Item{{Seq: seq, Q: q, K: k, V: v}}, client.StepOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want, err := ref.Step(ctx, l, []client.Item{{Seq: rseq, Q: q, K: k, V: v}}, client.StepOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range want.O {
				if math.Float32bits(got.O[i]) != math.Float32bits(want.O[i]) {
					t.Fatalf("layer %d: output %d is %v, the cluster that never stopped has %v", l, i, got.O[i], want.O[i])
				}
			}
			hist[l][0], hist[l][1] = append(hist[l][0], k...), append(hist[l][1], v...)
		}
	}
	// 37 tokens and a step: pages 0..8 full (rank 0 holds 0, 2, 4, 6,
	// 8; rank 1 holds 1, 3, 5, 7) and 2 tokens on page 9 (rank 1's
	// tail, lost).
	appendBoth(37)
	step()
	// half: a sequence whose creation only node 0's copy holds.
	crashed := []string{t.TempDir(), t.TempDir()}
	copyTree(t, dirs[1], crashed[1])
	half := create(c)
	copyTree(t, dirs[0], crashed[0])
	for _, nd := range nodes {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		nd.Stop(sctx)
		scancel()
	}

	nodes = nodetest.Start(t, "n", 2, ec, persist(crashed))
	c = dial(t, nodes[0])
	recs, dmg, err := c.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovered %+v, damaged %+v", recs, dmg)
	if len(recs) != 1 || len(dmg) != 1 || dmg[0].ID != half {
		t.Fatalf("recovered %+v, damaged %+v; want %s recovered and %s damaged", recs, dmg, seq, half)
	}
	r := recs[0]
	if r.ID != seq || r.Len != 36 || !slices.Equal(r.Lens, []int{36, 36}) || r.Had != 38 || r.LostTokens != 2 || !slices.Equal(r.Nodes, []string{"n0", "n1"}) {
		t.Fatalf("recovered %+v, want %s of length 36, had 38, lost 2, on n0 and n1", r, seq)
	}
	for _, nd := range nodes {
		if p := nd.Stats().Recovery.Parked; p != 0 {
			t.Fatalf("%s: %d sequences parked after the adoption", nd.Name(), p)
		}
	}
	for l := range ec.Layers {
		if err := c.Append(ctx, seq, l, hist[l][0][36*kv:], hist[l][1][36*kv:]); err != nil {
			t.Fatal(err)
		}
	}
	step()
	step()
	if err := c.Release(ctx, seq); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes {
		if st := nd.Stats(); st.PagesDevice != 0 {
			t.Fatalf("%s: %d pages in use after the release", nd.Name(), st.PagesDevice)
		}
	}
}
