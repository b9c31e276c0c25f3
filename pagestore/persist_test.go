package pagestore_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

const (
	pLayers, pQH, pKVH, pD, pS = 2, 4, 2, 8, 4
	pTok                       = pKVH * pD
)

func pConfig(dir string) pagestore.Config {
	return pagestore.Config{
		Layers:   pLayers,
		Geometry: plan.Geometry{QHeads: pQH, KVHeads: pKVH, HeadDim: pD, PageSize: pS, DType: plan.Float32},
		Capacity: 96, MemoryLimit: -1, DataDir: dir, Verify: envVerify(),
	}
}

// envVerify is Config.Verify for the persistence tests:
// QUESTRT_TEST_VERIFY=on-read runs them with lazy recovery (those that
// expect damage at open then fail, as they should), unset the default.
func envVerify() pagestore.Verify {
	if os.Getenv("QUESTRT_TEST_VERIFY") == "on-read" {
		return pagestore.VerifyOnRead
	}
	return pagestore.VerifyAtOpen
}

func openP(t testing.TB, c pagestore.Config) *pagestore.Store {
	t.Helper()
	s, err := pagestore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tokenKV is token i of stream seed: deterministic K/V.
func tokenKV(seed uint64, i int) (k, v []float32) {
	rng := rand.New(rand.NewPCG(seed, uint64(i)))
	k, v = make([]float32, pTok), make([]float32, pTok)
	for j := range k {
		k[j], v[j] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	return k, v
}

// streams remembers which token stream each sequence holds, so a test
// can re-append what was lost.
type streams map[pagestore.SeqID][]tokRef

type tokRef struct {
	seed uint64
	i    int
}

func appendN(t testing.TB, s *pagestore.Store, st streams, id pagestore.SeqID, seed uint64, n int) {
	t.Helper()
	for range n {
		i := len(st[id])
		k, v := tokenKV(seed, i)
		for l := range pLayers {
			if err := s.Append(id, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
		st[id] = append(st[id], tokRef{seed, i})
	}
}

// script runs the kill test's workload: forks, a prefix fork, a
// rollback and a release among several sequences.
func script(t testing.TB, s *pagestore.Store) streams {
	st := streams{}
	a := s.Create()
	appendN(t, s, st, a, 1, 23)
	b, err := s.Fork(a)
	if err != nil {
		t.Fatal(err)
	}
	st[b] = slices.Clone(st[a])
	appendN(t, s, st, b, 2, 10)
	appendN(t, s, st, a, 1, 6)
	c, err := s.ForkPrefix(a, 13)
	if err != nil {
		t.Fatal(err)
	}
	st[c] = slices.Clone(st[a][:13])
	appendN(t, s, st, c, 3, 5)
	d := s.Create()
	appendN(t, s, st, d, 4, 3)
	e := s.Create()
	appendN(t, s, st, e, 5, 10)
	if err := s.Rollback(e, 3); err != nil {
		t.Fatal(err)
	}
	st[e] = st[e][:7]
	f, err := s.Fork(b)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, s, st, f, 6, 9)
	if err := s.Release(f); err != nil {
		t.Fatal(err)
	}
	delete(st, f)
	return st
}

func newShard(t testing.TB, c pagestore.Config) *shard.Shard {
	t.Helper()
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	t.Cleanup(func() { be.Close() })
	pol := plan.DefaultPolicy()
	pol.SinkPages, pol.LocalPages, pol.DenseLayers = 1, 1, 0
	pol.BudgetTokens = 3 * pS
	sh, err := shard.New(shard.Config{Store: c, Policy: pol}, be)
	if err != nil {
		t.Fatal(err)
	}
	return sh
}

func sameSummaries(t testing.TB, what string, got, want *pagestore.Store, gid, wid pagestore.SeqID, pages int) {
	t.Helper()
	gt, _ := got.AppendPageTable(nil, gid)
	wt, _ := want.AppendPageTable(nil, wid)
	for i := range pages {
		for l := range pLayers {
			for h := range pKVH {
				gmn, gmx := got.PageSummary(l, int(gt[i]), h)
				wmn, wmx := want.PageSummary(l, int(wt[i]), h)
				for j := range gmn {
					if math.Float32bits(gmn[j]) != math.Float32bits(wmn[j]) || math.Float32bits(gmx[j]) != math.Float32bits(wmx[j]) {
						t.Fatalf("%s seq %d page %d layer %d head %d: summary differs", what, gid, i, l, h)
					}
				}
				gk, gv := readKV(t, got, l, gt[i], h)
				wk, wv := readKV(t, want, l, wt[i], h)
				n := min(pS, max(0, mustLen(t, got, gid)-i*pS)) * pD
				if !slices.Equal(gk[:n], wk[:n]) || !slices.Equal(gv[:n], wv[:n]) {
					t.Fatalf("%s seq %d page %d layer %d head %d: K/V differ", what, gid, i, l, h)
				}
			}
		}
	}
}

func readKV(t testing.TB, s *pagestore.Store, l int, p int32, h int) (k, v []float32) {
	t.Helper()
	k, v = make([]float32, pKVH*pS*pD), make([]float32, pKVH*pS*pD)
	if err := s.ReadKV(context.Background(), l, p, k, v); err != nil {
		t.Fatal(err)
	}
	o := h * pS * pD
	return k[o : o+pS*pD], v[o : o+pS*pD]
}

func mustLen(t testing.TB, s *pagestore.Store, id pagestore.SeqID) int {
	t.Helper()
	n, err := s.Len(id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// stepBoth runs one decode step of every layer on both shards with the
// same queries and requires bit-identical outputs.
func stepBoth(t testing.TB, got, want *shard.Shard, ids []pagestore.SeqID) {
	t.Helper()
	rng := rand.New(rand.NewPCG(9, 9))
	var reqs []shard.SeqStep
	for _, id := range ids {
		q := make([]float32, pQH*pD)
		for j := range q {
			q[j] = float32(rng.NormFloat64())
		}
		reqs = append(reqs, shard.SeqStep{Seq: id, Q: q})
	}
	for l := range pLayers {
		var a, b shard.StepResult
		if err := got.Step(context.Background(), l, reqs, shard.StepOptions{}, &a); err != nil {
			t.Fatal(err)
		}
		if err := want.Step(context.Background(), l, reqs, shard.StepOptions{}, &b); err != nil {
			t.Fatal(err)
		}
		for i := range a.O {
			if math.Float32bits(a.O[i]) != math.Float32bits(b.O[i]) {
				t.Fatalf("layer %d: O[%d] = %v, reference %v", l, i, a.O[i], b.O[i])
			}
		}
		for i := range a.LSE {
			if math.Float32bits(a.LSE[i]) != math.Float32bits(b.LSE[i]) {
				t.Fatalf("layer %d: LSE[%d] = %v, reference %v", l, i, a.LSE[i], b.LSE[i])
			}
		}
	}
}

// reappend appends the tokens of st[id] past the store's length.
func reappend(t testing.TB, s *pagestore.Store, id pagestore.SeqID, toks []tokRef) {
	t.Helper()
	for _, tr := range toks[mustLen(t, s, id):] {
		k, v := tokenKV(tr.seed, tr.i)
		for l := range pLayers {
			if err := s.Append(id, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// checkRecovered compares a store recovered after a crash with the
// reference that never stopped: lengths floored to whole pages, the lost
// tail tokens exactly, summaries and K/V bit for bit; then re-appends the
// lost tokens and compares the next decode step.
func checkRecovered(t testing.TB, rec, ref *shard.Shard, st streams) {
	t.Helper()
	rs, fs := rec.Store(), ref.Store()
	rep := rs.Recovery()
	if len(rep.Damaged) != 0 || len(rep.CorruptSlots) != 0 {
		t.Fatalf("damaged %v, corrupt slots %v", rep.Damaged, rep.CorruptSlots)
	}
	var ids []pagestore.SeqID
	for id := range st {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if len(rep.Sequences) != len(ids) {
		t.Fatalf("recovered %+v, want sequences %v", rep.Sequences, ids)
	}
	for i, id := range ids {
		r := rep.Sequences[i]
		n := len(st[id])
		if r.ID != id || r.Len != n/pS*pS || r.LostTokens != n-r.Len || r.TailPersisted {
			t.Fatalf("seq %d of %d tokens: recovered %+v", id, n, r)
		}
		sameSummaries(t, "recovered", rs, fs, id, id, r.Len/pS)
		reappend(t, rs, id, st[id])
		sameSummaries(t, "re-appended", rs, fs, id, id, (n+pS-1)/pS)
	}
	stepBoth(t, rec, ref, ids)
}

// TestKillRecover: a child process runs the script on a persisting
// store (SyncOnWrite) and is killed with SIGKILL; the parent recovers the
// directory and compares with a reference that never stopped.
func TestKillRecover(t *testing.T) {
	if dir := os.Getenv("QUESTRT_PAGESTORE_KILL_DIR"); dir != "" {
		sh := newShard(t, pConfig(dir))
		script(t, sh.Store())
		os.Stdout.WriteString("READY\n")
		time.Sleep(time.Minute)
		t.Fatal("not killed")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillRecover$", "-test.count=1")
	cmd.Env = append(os.Environ(), "QUESTRT_PAGESTORE_KILL_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(out)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child ended before READY: %v", err)
		}
		if strings.TrimSpace(line) == "READY" {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, br)
	_ = cmd.Wait()

	ref := newShard(t, pConfig(""))
	st := script(t, ref.Store())
	rec := newShard(t, pConfig(dir))
	defer rec.Close()
	checkRecovered(t, rec, ref, st)
	rep := rec.Store().Recovery()
	if rep.Sequences[1].Shared == 0 {
		t.Errorf("fork shares no recovered page: %+v", rep.Sequences)
	}
}

// copyDir copies a data directory while its store is open: the state a
// process crash leaves (the copy reads the page cache).
func copyDir(t testing.TB, src string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestCrashImageOffload: the same comparison on crash images of
// persisting stores with and without offload and in both durability
// modes (periodic after an explicit Sync).
func TestCrashImageOffload(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget int
		mode   pagestore.Durability
	}{{"plain", 0, pagestore.SyncOnWrite}, {"offload", 12, pagestore.SyncOnWrite}, {"periodic", 12, pagestore.SyncPeriodic}} {
		t.Run(tc.name, func(t *testing.T) {
			c := pConfig(t.TempDir())
			c.DeviceBudget, c.Durability = tc.budget, tc.mode
			c.SyncInterval = time.Hour
			sh := newShard(t, c)
			st := script(t, sh.Store())
			if err := sh.Store().Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			img := copyDir(t, c.DataDir)
			sh.Close()
			ref := newShard(t, pConfig(""))
			script(t, ref.Store())
			c.DataDir = img
			rec := newShard(t, c)
			defer rec.Close()
			checkRecovered(t, rec, ref, st)
			if err := rec.Store().CheckResidency(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCloseReopen: a graceful Close persists the tail pages: everything
// comes back, nothing lost, and the next step equals the reference's.
func TestCloseReopen(t *testing.T) {
	c := pConfig(t.TempDir())
	sh := newShard(t, c)
	st := script(t, sh.Store())
	if err := sh.Close(); err != nil {
		t.Fatal(err)
	}
	ref := newShard(t, pConfig(""))
	script(t, ref.Store())
	rec := newShard(t, c)
	rep := rec.Store().Recovery()
	if len(rep.Sequences) != len(st) || len(rep.Damaged) != 0 {
		t.Fatalf("report %+v", rep)
	}
	var ids []pagestore.SeqID
	for _, r := range rep.Sequences {
		n := len(st[r.ID])
		if r.Len != n || r.LostTokens != 0 || (n%pS != 0) != r.TailPersisted {
			t.Fatalf("seq %d of %d tokens: %+v", r.ID, n, r)
		}
		sameSummaries(t, "reopened", rec.Store(), ref.Store(), r.ID, r.ID, (n+pS-1)/pS)
		ids = append(ids, r.ID)
	}
	stepBoth(t, rec, ref, ids)
	// Appending to a recovered tail, sealing it, then rolling back into
	// a sealed page, and a second close/reopen, still match.
	for _, id := range ids {
		appendN(t, rec.Store(), st, id, 7, 6)
		appendN(t, ref.Store(), streams{id: slices.Clone(st[id][:len(st[id])-6])}, id, 7, 6)
		for _, s := range []*pagestore.Store{rec.Store(), ref.Store()} {
			if err := s.Rollback(id, 7); err != nil {
				t.Fatal(err)
			}
		}
		st[id] = st[id][:len(st[id])-7]
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	rec = newShard(t, c)
	defer rec.Close()
	for _, id := range ids {
		sameSummaries(t, "second reopen", rec.Store(), ref.Store(), id, id, (len(st[id])+pS-1)/pS)
	}
	stepBoth(t, rec, ref, ids)
	if _, err := rec.Store().Fork(ids[0]); err != nil {
		t.Fatal(err)
	}
}

func TestDataDirInUse(t *testing.T) {
	c := pConfig(t.TempDir())
	s := openP(t, c)
	defer s.Close()
	if _, err := pagestore.New(c); !errors.Is(err, pagestore.ErrInUse) {
		t.Fatalf("second open: %v, want ErrInUse", err)
	}
	other := c
	other.HeadDim = 4
	s.Close()
	if _, err := pagestore.New(other); !errors.Is(err, pagestore.ErrInvalidConfig) {
		t.Fatalf("other geometry: %v, want ErrInvalidConfig", err)
	}
}

func TestPersistConfigValidate(t *testing.T) {
	c := pConfig("x")
	c.Durability = 7
	if err := c.Validate(); !errors.Is(err, pagestore.ErrInvalidConfig) {
		t.Fatal(err)
	}
	c.Durability, c.SyncInterval = pagestore.SyncPeriodic, -1
	if err := c.Validate(); !errors.Is(err, pagestore.ErrInvalidConfig) {
		t.Fatal(err)
	}
	c.SyncInterval = 0
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := pagestore.NewWithData(c, nil); !errors.Is(err, pagestore.ErrInvalidConfig) {
		t.Fatal(err)
	}
}

// seqSlots reads the slot list of seq id from a closed data directory.
func seqSlots(t testing.TB, dir string, id pagestore.SeqID) []uint32 {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "store.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var slots []uint32
	db.View(func(tx *bolt.Tx) error {
		k := make([]byte, 12)
		for i := range 8 {
			k[i] = byte(uint64(id) >> (56 - 8*i))
		}
		v := tx.Bucket([]byte("tables")).Get(k)
		for i := 0; i+8 <= len(v); i += 4 {
			slots = append(slots, uint32(v[i])|uint32(v[i+1])<<8|uint32(v[i+2])<<16|uint32(v[i+3])<<24)
		}
		return nil
	})
	return slots
}

// TestCorruption: a flipped byte in one slab slot and one in one bbolt
// value each damage exactly the sequence that uses them; the others
// recover intact, and the damaged ones' pages are free.
func TestCorruption(t *testing.T) {
	c := pConfig(t.TempDir())
	s := openP(t, c)
	st := streams{}
	x, y, z := s.Create(), s.Create(), s.Create()
	appendN(t, s, st, x, 1, 9)
	appendN(t, s, st, y, 2, 9)
	appendN(t, s, st, z, 3, 9)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	sl := seqSlots(t, c.DataDir, x)[1]
	slab := filepath.Join(c.DataDir, "slab-000000")
	f, err := os.OpenFile(slab, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	slotBytes := (int64(c.PayloadBytes()) + 4095) / 4096 * 4096
	var b [1]byte
	f.ReadAt(b[:], int64(sl)*slotBytes+5)
	b[0] ^= 0x40
	f.WriteAt(b[:], int64(sl)*slotBytes+5)
	f.Close()
	db, err := bolt.Open(filepath.Join(c.DataDir, "store.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte("seqs"))
		k := []byte{0, 0, 0, 0, 0, 0, 0, byte(y)}
		v := slices.Clone(bk.Get(k))
		v[16] ^= 1 // layer 0's length
		return bk.Put(k, v)
	})
	db.Close()

	ref := openP(t, pConfig(""))
	rst := streams{}
	for i, id := range []pagestore.SeqID{ref.Create(), ref.Create(), ref.Create()} {
		appendN(t, ref, rst, id, uint64(i+1), 9)
	}
	rec := openP(t, c)
	defer rec.Close()
	rep := rec.Recovery()
	if len(rep.Damaged) != 2 || rep.Damaged[0].ID != x || rep.Damaged[1].ID != y || !slices.Equal(rep.CorruptSlots, []int{int(sl)}) {
		t.Fatalf("report %+v", rep)
	}
	for _, d := range rep.Damaged {
		if d.Tokens != 9 && d.ID == x {
			t.Errorf("damaged %+v: want 9 tokens known", d)
		}
	}
	if len(rep.Sequences) != 1 || rep.Sequences[0].ID != z || rep.Sequences[0].Len != 9 {
		t.Fatalf("recovered %+v", rep.Sequences)
	}
	sameSummaries(t, "intact", rec, ref, z, z, 3)
	if st := rec.Stats(); st.UsedPages != 3 {
		t.Fatalf("%d pages used, want z's 3", st.UsedPages)
	}
	if _, err := rec.Len(x); !errors.Is(err, pagestore.ErrUnknownSequence) {
		t.Fatal(err)
	}
	// The damage is reported once: the directory now holds z only.
	rec.Close()
	again := openP(t, c)
	defer again.Close()
	if r := again.Recovery(); len(r.Damaged) != 0 || len(r.Sequences) != 1 {
		t.Fatalf("second recovery %+v", r)
	}
}

// TestRecycleAcrossRestart: pages of a released sequence reused by
// another never bring old data back after a crash, and a recovered
// store hands out fresh pages.
func TestRecycleAcrossRestart(t *testing.T) {
	c := pConfig(t.TempDir())
	c.Capacity = 4
	s := openP(t, c)
	st := streams{}
	a := s.Create()
	appendN(t, s, st, a, 1, 12)
	if err := s.Release(a); err != nil {
		t.Fatal(err)
	}
	b := s.Create()
	appendN(t, s, st, b, 2, 6)
	img := copyDir(t, c.DataDir)
	s.Close()
	c.DataDir = img
	rec := openP(t, c)
	defer rec.Close()
	rep := rec.Recovery()
	if len(rep.Sequences) != 1 || rep.Sequences[0].ID != b || rep.Sequences[0].Len != 4 || rep.Sequences[0].LostTokens != 2 || rep.OrphanSlots == 0 {
		t.Fatalf("report %+v", rep)
	}
	ref := openP(t, pConfig(""))
	ref.Create()
	rb := ref.Create()
	appendN(t, ref, streams{}, rb, 2, 6)
	sameSummaries(t, "recycled", rec, ref, b, rb, 1)
	n := rec.Create()
	if n <= b {
		t.Fatalf("new id %d after recovered %d", n, b)
	}
	appendN(t, rec, streams{}, n, 3, 1)
	tb, _ := rec.AppendPageTable(nil, n)
	for l := range pLayers {
		for h := range pKVH {
			k, _ := readKV(t, rec, l, tb[0], h)
			mn, mx := rec.PageSummary(l, int(tb[0]), h)
			for j := range pD {
				if mn[j] != k[j] || mx[j] != k[j] {
					t.Fatalf("recycled page summary not fresh: %v %v vs key %v", mn, mx, k[:pD])
				}
			}
		}
	}
}

// TestRefcountsAcrossRestarts: random creates, forks, prefix forks,
// appends, rollbacks and releases, with graceful restarts and crash
// images in between, against a model of each sequence's tokens; after
// every restart each sequence holds its model's tokens (floored to whole
// pages after a crash, with the lost count exact), and the pool's used
// and shared pages equal what the page tables name.
func TestRefcountsAcrossRestarts(t *testing.T) {
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 77))
		c := pConfig(t.TempDir())
		c.Capacity = 64
		if seed%2 == 1 {
			c.DeviceBudget = 16
		}
		s := openP(t, c)
		model := streams{}
		next := uint64(100)
		for step := range 120 {
			var ids []pagestore.SeqID
			for id := range model {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			pick := func() pagestore.SeqID { return ids[rng.IntN(len(ids))] }
			op := rng.IntN(10)
			if os.Getenv("PDBG") != "" {
				t.Logf("step %d op %d ids %v lens %v", step, op, ids, lensOf(model))
			}
			switch {
			case op < 2 || len(ids) == 0:
				if len(ids) < 6 {
					model[s.Create()] = nil
				}
			case op < 5:
				id := pick()
				if s.Stats().FreePages < 8 {
					break
				}
				next++
				appendN(t, s, model, id, next, 1+rng.IntN(9))
			case op < 6 && len(ids) < 6:
				id := pick()
				n := rng.IntN(len(model[id]) + 1)
				ch, err := s.ForkPrefix(id, n)
				if err != nil {
					t.Fatal(err)
				}
				model[ch] = slices.Clone(model[id][:n])
			case op < 7:
				id := pick()
				if n := len(model[id]); n > 0 {
					k := 1 + rng.IntN(n)
					if err := s.Rollback(id, k); err != nil {
						t.Fatal(err)
					}
					model[id] = model[id][:n-k]
				}
			case op < 8:
				id := pick()
				if err := s.Release(id); err != nil {
					t.Fatal(err)
				}
				delete(model, id)
			case op < 9:
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				s = openP(t, c)
				checkModel(t, s, model, false)
			default:
				img := copyDir(t, c.DataDir)
				s.Close()
				c.DataDir = img
				s = openP(t, c)
				checkModel(t, s, model, true)
				for _, r := range s.Recovery().Sequences {
					model[r.ID] = model[r.ID][:r.Len]
				}
			}
			_ = step
		}
		s.Close()
	}
}

func checkModel(t *testing.T, s *pagestore.Store, model streams, crash bool) {
	t.Helper()
	rep := s.Recovery()
	if len(rep.Damaged) != 0 || len(rep.Sequences) != len(model) {
		t.Fatalf("report %+v, model has %d sequences", rep, len(model))
	}
	refs := map[int32]int{}
	for _, r := range rep.Sequences {
		toks, ok := model[r.ID]
		if !ok {
			t.Fatalf("recovered unknown seq %d", r.ID)
		}
		// After a crash: the last commit's state, at least every page
		// sealed (a tail written by an earlier Close comes back too).
		want := len(toks)
		if crash && r.Len >= want/pS*pS && r.Len <= want {
			want = r.Len
		}
		if r.Len != want || r.LostTokens != len(toks)-want {
			t.Fatalf("seq %d of %d tokens (crash %v): %+v", r.ID, len(toks), crash, r)
		}
		tb, _ := s.AppendPageTable(nil, r.ID)
		for _, p := range tb {
			refs[p]++
		}
		for i, tr := range toks[:want] {
			wk, wv := tokenKV(tr.seed, tr.i)
			for l := range pLayers {
				for h := range pKVH {
					k, v := readKV(t, s, l, tb[i/pS], h)
					o := (i % pS) * pD
					if !slices.Equal(k[o:o+pD], wk[h*pD:(h+1)*pD]) || !slices.Equal(v[o:o+pD], wv[h*pD:(h+1)*pD]) {
						t.Fatalf("seq %d token %d layer %d head %d differs", r.ID, i, l, h)
					}
				}
			}
		}
	}
	st := s.Stats()
	shared := 0
	for _, n := range refs {
		if n > 1 {
			shared++
		}
	}
	if st.UsedPages != len(refs) || st.SharedPages != shared || st.Sequences != len(model) {
		t.Fatalf("stats %+v; page tables name %d pages, %d shared", st, len(refs), shared)
	}
	if err := s.CheckResidency(); err != nil {
		t.Fatal(err)
	}
}

func lensOf(m streams) map[pagestore.SeqID]int {
	r := map[pagestore.SeqID]int{}
	for id, t := range m {
		r[id] = len(t)
	}
	return r
}
