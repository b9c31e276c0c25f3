package coord_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// TestAdoptedDamagedOnRead: two persisting nodes opening their data
// directories with pagestore.VerifyOnRead (no scrub). One slab byte of
// a page of sequence a is flipped while they are down. After the
// restart the coordinator adopts a and b (the damage is not read yet);
// a's first step fails with DATA_LOSS, and from then on the
// coordinator lists a as damaged, with the node's failed check as its
// reason, instead of adopted (Recovered and Status); b's steps equal,
// bit for bit, those of a cluster that never stopped. After another
// restart a is reported damaged again, with the check's failure as the
// reason (the worker dropped it and kept a tombstone), not as a store
// sequence that was not persisted.
func TestAdoptedDamagedOnRead(t *testing.T) {
	ec := geometry(2, 1)
	dirs := []string{t.TempDir(), t.TempDir()}
	persist := func(i int, c *node.Config) {
		c.DataDir, c.Verify, c.ScrubRate = dirs[i], pagestore.VerifyOnRead, -1
	}
	nodes := nodetest.Start(t, "n", 2, ec, persist)
	refNodes := startCluster(t, 2, ec)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c0, ref := dial(t, nodes[0]), dial(t, refNodes[0])
	rng := rand.New(rand.NewPCG(31, 7))
	mk := func() *twin {
		seq, _, err := c0.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		rsq, _, err := ref.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		return &twin{t: t, ctx: ctx, ec: ec, rng: rng, c: c0, ref: ref, seq: seq, rsq: rsq}
	}
	a, b := mk(), mk()
	// a's first token's keys of head 0 in layer 0, to find in a slab.
	kv := ec.KVHeads * ec.HeadDim
	k := randVec(rng, 12*kv)
	for l := range ec.Layers {
		kl := k
		if l > 0 {
			kl = randVec(rng, 12*kv)
		}
		if err := c0.Append(ctx, a.seq, l, kl, randVec(rng, 12*kv)); err != nil {
			t.Fatal(err)
		}
	}
	b.appendN(13)
	b.step()
	stopAll(nodes...)

	pat := make([]byte, 0, 4*ec.HeadDim)
	for _, x := range k[:ec.HeadDim] {
		pat = binary.LittleEndian.AppendUint32(pat, math.Float32bits(x))
	}
	flipped := ""
	for _, dir := range dirs {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !strings.HasPrefix(d.Name(), "slab-") {
				return nil
			}
			bs, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if i := bytes.Index(bs, pat); i >= 0 {
				bs[i+1] ^= 0x40
				if err := os.WriteFile(p, bs, 0o600); err != nil {
					t.Fatal(err)
				}
				flipped = p
			}
			return nil
		})
	}
	if flipped == "" {
		t.Fatal("a's first keys are in no slab")
	}

	nodes = nodetest.Start(t, "n", 2, ec, persist)
	c0 = dial(t, nodes[0])
	recs, dmg, err := c0.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || len(dmg) != 0 {
		t.Fatalf("lazy restart: recovered %+v, damaged %+v; want a and b adopted, the damage not read yet", recs, dmg)
	}
	a.c, b.c = c0, c0
	qd := ec.QHeads * ec.HeadDim
	_, err = c0.Step(ctx, 0, []client.Item{{Seq: a.seq, Q: randVec(rng, qd), K: randVec(rng, kv), V: randVec(rng, kv)}}, client.StepOptions{})
	if status.Code(err) != codes.DataLoss {
		t.Fatalf("step of damaged %s: %v, want DATA_LOSS", a.seq, err)
	}
	recs, dmg, err = c0.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the first use: recovered %+v, damaged %+v", recs, dmg)
	if len(recs) != 1 || recs[0].ID != b.seq || len(dmg) != 1 || dmg[0].ID != a.seq || dmg[0].Parked ||
		!strings.Contains(dmg[0].Reason, "checksum") || strings.Contains(dmg[0].Reason, flipped) {
		t.Fatalf("after a's first use: recovered %+v, damaged %+v; want b adopted, a damaged naming its failed checksum (no server path)", recs, dmg)
	}
	st, err := c0.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sd := st.GetDamaged(); len(sd) != 1 || sd[0].GetReason() != dmg[0].Reason {
		t.Errorf("Status lists damaged %v, want %s with reason %q", sd, a.seq, dmg[0].Reason)
	}
	b.step()
	b.step()
	stopAll(nodes...)

	nodes = nodetest.Start(t, "n", 2, ec, persist)
	c0 = dial(t, nodes[0])
	recs, dmg, err = c0.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second restart: recovered %+v, damaged %+v", recs, dmg)
	if len(recs) != 1 || recs[0].ID != b.seq || len(dmg) != 1 || dmg[0].ID != a.seq ||
		!strings.Contains(dmg[0].Reason, "checksum") || strings.Contains(dmg[0].Reason, "not persisted") {
		t.Fatalf("second restart: recovered %+v, damaged %+v; want b adopted, a damaged with its failed checksum as the reason", recs, dmg)
	}
	b.c = c0
	b.step()
}
