package remote

import (
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// TestPersistVerifyOnReadOverWire: nodes whose grids verify recovered
// pages on read (ServerConfig.Verify) restart on a directory whose slab
// bytes were flipped: the grid opens and reports the sequence recovered
// on both nodes (its damage not seen yet, no page read), and the first
// call that reads its pages on the damaged node fails with DATA_LOSS,
// an error that errors.Is pagestore.ErrDamaged on the caller's side and
// names no server path; the intact node's pages read back.
func TestPersistVerifyOnReadOverWire(t *testing.T) {
	ec := engineConfig(2, 1, plan.Exact)
	wc := workerConfig(ec)
	dirs := []string{t.TempDir(), t.TempDir()}
	lazy := func(c *ServerConfig) { c.Verify, c.ScrubRate = pagestore.VerifyOnRead, -1 }
	ctx := context.Background()
	nodes := persistNodes(t, dirs, lazy)
	clients, eng := openCP2(t, ec, wc, nodes, "coord-a/1/1")
	rng := rand.New(rand.NewPCG(5, 5))
	kv := ec.KVHeads * ec.HeadDim
	const n = 4 * 16 // two full pages on each rank
	id, err := eng.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	for l := range ec.Layers {
		k, v := make([]float32, n*kv), make([]float32, n*kv)
		for i := range k {
			k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		if err := eng.Append(id, l, k, v); err != nil {
			t.Fatal(err)
		}
	}
	eng.Close()
	if err := CloseGrid(ctx, clients...); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes {
		nd.conn.Close()
		nd.stop()
	}
	// Flip a byte of every 4 KiB of node 0's slabs.
	flipped := 0
	err = filepath.WalkDir(dirs[0], func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasPrefix(d.Name(), "slab-") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for off := 5; off < len(b); off += 4096 {
			b[off] ^= 0x40
		}
		flipped++
		return os.WriteFile(p, b, 0o600)
	})
	if err != nil || flipped == 0 {
		t.Fatalf("flipping slab bytes: %d slabs, %v", flipped, err)
	}

	nodes = persistNodes(t, dirs, lazy)
	clients, eng = openCP2(t, ec, wc, nodes, "coord-a/2/1")
	defer eng.Close()
	for i, c := range clients {
		rec := c.Recovered()
		if len(rec) != 1 || rec[0].Seq != uint64(id) || len(c.NotRecovered().Damaged) != 0 {
			t.Fatalf("node %d: recovered %+v, not recovered %+v; want sequence %d, nothing damaged yet", i, rec, c.NotRecovered(), id)
		}
		if err := c.Claim(ctx, rec[0].Key, rec[0].Seq); err != nil {
			t.Fatal(err)
		}
	}
	var rep worker.KeysReply
	if err := clients[1].Keys(ctx, worker.KeysRequest{Seq: uint64(id), Rank: worker.Rank{CP: 1}, Layer: 0, Count: 2}, &rep); err != nil || len(rep.K) != 2*ec.PageSize*kv {
		t.Fatalf("intact node: %d keys, %v", len(rep.K), err)
	}
	err = clients[0].Keys(ctx, worker.KeysRequest{Seq: uint64(id), Rank: worker.Rank{CP: 0}, Layer: 0, Count: 2}, &rep)
	if !errors.Is(err, pagestore.ErrDamaged) || status.Code(err) != codes.DataLoss {
		t.Fatalf("damaged node: %v (code %v), want pagestore.ErrDamaged, DATA_LOSS", err, status.Code(err))
	}
	// The answer names no server path: the slab relative to the grid's
	// directory.
	if msg := err.Error(); strings.Contains(msg, dirs[0]) || !strings.Contains(msg, "rank-tp0-cp0/slab-000000") {
		t.Fatalf("damaged node's answer %q: want no server path, the slab named relative to the grid's directory", msg)
	}
}
