package worker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/boltcheck"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// bbolt's page header (go.etcd.io/bbolt/internal/common/page.go): id
// uint64, flags uint16 at byte 8, count uint16 at 10, overflow uint32
// at 12; the meta page's page size is the uint32 at 16+8 of page 0.
const (
	boltBranch   = 0x01
	boltLeaf     = 0x02
	boltMeta     = 0x04
	boltFreelist = 0x10
)

// boltPage is one page of a bbolt file as its header says.
type boltPage struct {
	off, size int    // bytes: where it starts, how long (overflow included)
	class     string // meta, freelist, branch, leaf, or unused (no known flags)
	count     int
}

// boltPages classifies the pages of a bbolt file by their headers.
func boltPages(t *testing.T, b []byte) []boltPage {
	t.Helper()
	ps := int(binary.LittleEndian.Uint32(b[24:]))
	if ps < 1024 || ps > 1<<16 || len(b)%ps != 0 {
		t.Fatalf("bbolt page size %d for a file of %d bytes", ps, len(b))
	}
	var out []boltPage
	for off := 0; off < len(b); {
		flags := binary.LittleEndian.Uint16(b[off+8:])
		over := int(binary.LittleEndian.Uint32(b[off+12:]))
		p := boltPage{off: off, size: ps, count: int(binary.LittleEndian.Uint16(b[off+10:]))}
		switch flags {
		case boltBranch:
			p.class = "branch"
		case boltLeaf:
			p.class = "leaf"
		case boltMeta:
			p.class = "meta"
		case boltFreelist:
			p.class = "freelist"
		default:
			p.class, over = "unused", 0
		}
		if off+(1+over)*ps > len(b) {
			over = 0
		}
		p.size = (1 + over) * ps
		out = append(out, p)
		off += p.size
	}
	return out
}

// flipsOf picks the byte positions to damage in one page of a class:
// the header's fields, for a meta page each of its fields, for branch
// and leaf pages the first element header and bytes of keys and values,
// and a few random bytes.
func flipsOf(p boltPage, rng *rand.Rand) []int {
	rel := []int{8, 10, 12}
	switch p.class {
	case "meta":
		// magic, version, page size, flags, root bucket, freelist,
		// high-water mark, txid, checksum
		rel = append(rel, 16, 20, 24, 28, 32, 48, 56, 64, 72)
	case "branch", "leaf":
		rel = append(rel, 16, 20, 24, 28)
		elems := 16 + 16*p.count
		for range 2 {
			if elems < p.size {
				rel = append(rel, elems+rng.IntN(min(p.size-elems, 512)))
			}
		}
	case "freelist":
		rel = append(rel, 16, 16+8*rng.IntN(max(p.count, 1)))
	case "unused":
		rel = []int{rng.IntN(p.size)}
	}
	for i := range rel {
		rel[i] += p.off
	}
	return rel
}

// corruptWorkload is what TestCorruptionContained writes and checks.
type corruptWorkload struct {
	cfg  Config
	be   kernels.Backend
	lens map[uint64]int // sequence -> tokens, every layer
	// released were written and released: one may come back damaged
	// (bbolt falls back to the previous transaction when the last
	// one's meta page is damaged), never recovered.
	released map[uint64]bool
	k, v     map[uint64][][]float32 // sequence -> layer -> [tokens][KVHeads][HeadDim]
}

func (w *corruptWorkload) open(dir string) (*Local, func(), error) {
	cfg := w.cfg
	cfg.DataDir = dir
	tr := collective.NewInprocGroup(1)
	l, err := NewLocal(cfg, []RankSpec{{Rank: Rank{}, Backend: w.be, Transport: tr[0]}})
	return l, func() { tr[0].Close() }, err
}

// write creates seq with n tokens of random K/V in every layer.
func (w *corruptWorkload) write(t *testing.T, l *Local, rng *rand.Rand, seq uint64, n int) {
	t.Helper()
	if err := w.writeErr(l, rng, seq, n); err != nil {
		t.Fatal(err)
	}
}

// check returns an error when the live sequence seq of l does not hold
// exactly the tokens written, bit for bit, in every layer.
func (w *corruptWorkload) check(l *Local, seq uint64) error {
	return w.checkPrefix(l, seq, w.lens[seq])
}

// checkPrefix is check of the first n tokens, when seq holds n.
func (w *corruptWorkload) checkPrefix(l *Local, seq uint64, n int) error {
	c := w.cfg
	st := l.Shard(Rank{}).Store()
	id, err := l.StoreSeq(seq, Rank{})
	if err != nil {
		return err
	}
	table, err := st.AppendPageTable(nil, id)
	if err != nil {
		return err
	}
	blk := c.KVHeads * c.PageSize * c.HeadDim
	k, v := make([]float32, blk), make([]float32, blk)
	for layer := range c.Layers {
		have, err := st.LayerLen(id, layer)
		if err != nil {
			return err
		}
		if have != n {
			return fmt.Errorf("sequence %d layer %d: %d tokens, want %d (wrote %d)", seq, layer, have, n, w.lens[seq])
		}
		for t := range n {
			pg, slot := t/c.PageSize, t%c.PageSize
			if slot == 0 {
				if err := st.ReadKV(context.Background(), layer, table[pg], k, v); err != nil {
					return fmt.Errorf("sequence %d layer %d page %d: %w", seq, layer, pg, err)
				}
			}
			for h := range c.KVHeads {
				src := (t*c.KVHeads + h) * c.HeadDim
				dst := (h*c.PageSize + slot) * c.HeadDim
				if !equalBits(k[dst:dst+c.HeadDim], w.k[seq][layer][src:src+c.HeadDim]) ||
					!equalBits(v[dst:dst+c.HeadDim], w.v[seq][layer][src:src+c.HeadDim]) {
					return fmt.Errorf("sequence %d layer %d token %d head %d: K/V differ from what was written", seq, layer, t, h)
				}
			}
		}
	}
	return nil
}

// TestCorruptionContained damages one byte at a time of every file kind
// a persisting worker writes: its sequence table (worker.db), the page
// store's manifests (store.db) and its disk tier's index (index.db),
// at positions of every page class that the pages' own headers name
// (meta, freelist, branch, leaf, unused), and the slab files and the
// lengths file. Each damaged copy is opened as a restarted node would,
// and each outcome must be one of:
//   - refused as damaged (an error wrapping tier.ErrCorrupt or
//     pagestore.ErrOtherFormat: what worker/remote quarantines);
//   - opened, with every written sequence either recovered with all its
//     tokens, bit for bit, or reported damaged: never silently shorter,
//     never silently wrong.
//
// When it opened, a new sequence must work there, and the directory
// must open again after a graceful close with the same sequences intact
// (a freelist that hands out pages in use would show there). No panic
// may escape, and another worker's grid open in the same process all
// along keeps working.
func TestCorruptionContained(t *testing.T) {
	cfg := testConfig(Exact)
	cfg.CP, cfg.Capacity = 1, 320
	// At open: every damaged copy is refused or reported by the
	// recovery (VerifyOnRead reports a damaged page at first use).
	cfg.Verify = pagestore.VerifyAtOpen
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer be.Close()
	w := &corruptWorkload{cfg: cfg, be: be, lens: map[uint64]int{}, k: map[uint64][][]float32{}, v: map[uint64][][]float32{}}
	rng := rand.New(rand.NewPCG(27, 2))
	pristine := t.TempDir()
	l, closeTr, err := w.open(pristine)
	if err != nil {
		t.Fatal(err)
	}
	// Enough pages that the page table and the index span several leaf
	// pages under a branch page; a release so that the files have free
	// pages.
	for seq, n := range []int{1: 700, 2: 1100, 3: 1500, 4: 300} {
		if n > 0 {
			w.write(t, l, rng, uint64(seq), n)
		}
	}
	if err := l.Release(context.Background(), ReleaseRequest{Seq: 4}); err != nil {
		t.Fatal(err)
	}
	delete(w.lens, 4)
	w.released = map[uint64]bool{4: true}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	closeTr()

	// Another grid of the node, open through every trial.
	ow := &corruptWorkload{cfg: cfg, be: be, lens: map[uint64]int{}, k: map[uint64][][]float32{}, v: map[uint64][][]float32{}}
	other, closeOther, err := ow.open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer closeOther()
	defer other.Close()
	ow.write(t, other, rng, 50, 40)

	type target struct {
		file, class string
		pos         int
	}
	var targets []target
	classes := map[string]map[string]bool{}
	err = filepath.WalkDir(pristine, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(pristine, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case strings.HasSuffix(rel, ".db"):
			classes[filepath.Base(rel)] = map[string]bool{}
			per := map[string]int{}
			for _, pg := range boltPages(t, b) {
				classes[filepath.Base(rel)][pg.class] = true
				if per[pg.class]++; per[pg.class] > 2 {
					continue // two pages of a class are enough
				}
				for _, pos := range flipsOf(pg, rng) {
					targets = append(targets, target{rel, pg.class, pos})
				}
			}
		case len(b) == 0:
		case filepath.Base(rel) == "lengths":
			// Format 2: 32-byte blocks for 2 layers; block 0 the header
			// (20 bytes checked), the others a record each: its head
			// (id, layers, CRC) and an entry per layer. Two flips of
			// each, in the blocks of live sequences.
			classes["lengths"] = map[string]bool{}
			const blk = 32
			var live []int
			for i := blk; i+blk <= len(b); i += blk {
				if slices.ContainsFunc(b[i:i+blk], func(x byte) bool { return x != 0 }) {
					live = append(live, i)
				}
			}
			if len(live) == 0 || w.cfg.Layers != 2 {
				t.Fatalf("lengths file of %d bytes, %d live records, %d layers: want format 2 with 2 layers", len(b), len(live), w.cfg.Layers)
			}
			for range 2 {
				at := live[rng.IntN(len(live))]
				targets = append(targets,
					target{rel, "header", rng.IntN(20)},
					target{rel, "record", at + rng.IntN(16)},
					target{rel, "entry", at + 16 + rng.IntN(16)})
			}
			for _, c := range []string{"header", "record", "entry"} {
				classes["lengths"][c] = true
			}
		default: // slab files
			for range 4 {
				targets = append(targets, target{rel, "slab", rng.IntN(len(b))})
			}
			classes["slab"] = map[string]bool{"slab": true}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string][]string{
		"worker.db": {"meta", "leaf"},
		"store.db":  {"meta", "freelist", "branch", "leaf"},
		"index.db":  {"meta", "freelist", "branch", "leaf"},
		"slab":      {"slab"},
		"lengths":   {"header", "record", "entry"},
	} {
		for _, c := range want {
			if !classes[file][c] {
				t.Errorf("%s has no %s page to damage (classes %v)", file, c, classes[file])
			}
		}
	}

	outcomes := map[string]map[string]int{} // file/class -> outcome -> count
	note := func(tg target, what string) {
		key := filepath.Base(tg.file) + "/" + tg.class
		if strings.HasPrefix(tg.class, "slab") {
			key = "slab"
		}
		if outcomes[key] == nil {
			outcomes[key] = map[string]int{}
		}
		outcomes[key][what]++
	}
	masks := []byte{0x01, 0x10, 0x80, 0xff}
	work := t.TempDir()
	for i, tg := range targets {
		dir := filepath.Join(work, fmt.Sprint(i))
		copyDir(t, pristine, dir)
		path := filepath.Join(dir, tg.file)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		mask := masks[i%len(masks)]
		b[tg.pos] ^= mask
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		what, err := w.trial(dir)
		if err != nil {
			t.Errorf("%s, %s page, byte %d ^ %#x: %v", tg.file, tg.class, tg.pos, mask, err)
			continue
		}
		if filepath.Base(tg.file) == "lengths" && what != "length records damaged" {
			// Every byte of a header or live record is checked: a flip
			// is reported (the sequences' losses unknown), never read
			// as a length.
			t.Errorf("%s, %s, byte %d ^ %#x: %s, want the damage reported", tg.file, tg.class, tg.pos, mask, what)
		}
		note(tg, what)
		os.RemoveAll(dir)
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range outcomes {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range keys {
		t.Logf("%-18s %v", k, outcomes[k])
	}
	t.Logf("%d damaged copies", len(targets))
	// The other grid saw none of it.
	if err := ow.check(other, 50); err != nil {
		t.Errorf("the other grid: %v", err)
	}
	ow.write(t, other, rng, 51, 20)
	if err := ow.check(other, 51); err != nil {
		t.Errorf("the other grid, a new sequence: %v", err)
	}
}

// trial opens the damaged directory dir and says how it came out
// ("refused", "intact", "damage reported"), or why that is wrong.
func (w *corruptWorkload) trial(dir string) (what string, err error) {
	defer func() {
		if r := recover(); r != nil {
			what, err = "", fmt.Errorf("panic: %v", r)
		}
	}()
	ctx := context.Background()
	l, closeTr, err := w.open(dir)
	if err != nil {
		closeTr()
		if errors.Is(err, tier.ErrCorrupt) || errors.Is(err, pagestore.ErrOtherFormat) {
			return "refused", nil
		}
		return "", fmt.Errorf("open failed, not as damage: %w", err)
	}
	defer closeTr()
	defer l.Close()
	rep := l.Recovery()
	recovered := map[uint64]int{} // sequence -> tokens kept
	what = "intact"
	for _, d := range rep.Damaged {
		if _, ok := w.lens[d.Seq]; !ok && !w.released[d.Seq] {
			return "", fmt.Errorf("damaged %d: no such sequence was written", d.Seq)
		}
		what = "damage reported"
	}
	for _, rr := range rep.Ranks {
		if rr.Lengths != nil && what == "intact" {
			if !errors.Is(rr.Lengths, tier.ErrCorrupt) {
				return "", fmt.Errorf("length records: %w, not as damage", rr.Lengths)
			}
			what = "length records damaged"
		}
	}
	for _, r := range rep.Sequences {
		if _, ok := w.lens[r.Seq]; !ok {
			return "", fmt.Errorf("recovered %d: no such sequence was written", r.Seq)
		}
		if err := l.Claim(ctx, r.Key, r.Seq); err != nil {
			return "", err
		}
		// Shorter than written only with the difference reported as
		// lost (bbolt fell back to the transaction before the last: the
		// lengths file still knows how long the sequence was).
		n := w.lens[r.Seq]
		if m := slices.Max(r.Lens); m < n {
			if r.Had < n || r.LostTokens() != r.Had-m {
				return "", fmt.Errorf("recovered silently shorter: sequence %d: %v tokens, had %d, lost %d; wrote %d", r.Seq, r.Lens, r.Had, r.LostTokens(), n)
			}
			what = "loss reported"
		}
		if err := w.checkPrefix(l, r.Seq, slices.Min(r.Lens)); err != nil {
			return "", fmt.Errorf("recovered silently wrong: %w", err)
		}
		recovered[r.Seq] = slices.Min(r.Lens)
	}
	for seq := range w.lens {
		if _, ok := recovered[seq]; ok {
			continue
		}
		if !slices.ContainsFunc(rep.Damaged, func(d DamagedSeq) bool { return d.Seq == seq }) {
			return "", fmt.Errorf("sequence %d neither recovered nor reported damaged", seq)
		}
	}
	// A new sequence works on the directory, and survives a restart with
	// the others.
	nw := &corruptWorkload{cfg: w.cfg, be: w.be, lens: map[uint64]int{}, k: map[uint64][][]float32{}, v: map[uint64][][]float32{}}
	for seq, n := range recovered {
		nw.lens[seq], nw.k[seq], nw.v[seq] = n, w.k[seq], w.v[seq]
	}
	if err := nw.writeErr(l, rand.New(rand.NewPCG(1, 1)), 900, 37); err != nil {
		// Damage that only a write meets (bbolt's assertions while it
		// rebalances a page): the write fails, reported to its caller.
		if errors.Is(err, boltcheck.ErrCorrupt) {
			return "write refused", nil
		}
		return "", fmt.Errorf("a new sequence: %w", err)
	}
	if err := nw.check(l, 900); err != nil {
		return "", fmt.Errorf("a new sequence: %w", err)
	}
	if err := l.Close(); err != nil {
		if errors.Is(err, boltcheck.ErrCorrupt) {
			// Damage the open's checks let through, found by a later
			// commit (bbolt's own assertion) and reported, not silent.
			return "write refused", nil
		}
		return "", fmt.Errorf("close: %w", err)
	}
	l2, closeTr2, err := nw.open(dir)
	defer closeTr2()
	if err != nil {
		// Damage the first open could not see, that its writes made
		// visible: refused now, reported as the first refusals are.
		if errors.Is(err, tier.ErrCorrupt) || errors.Is(err, pagestore.ErrOtherFormat) {
			return "refused on reopen", nil
		}
		return "", fmt.Errorf("reopen after a clean close: %w", err)
	}
	defer l2.Close()
	rep2 := l2.Recovery()
	if len(rep2.Damaged) != 0 || len(rep2.Sequences) != len(nw.lens) {
		return "", fmt.Errorf("reopen after a clean close: %d recovered (want %d), damaged %+v", len(rep2.Sequences), len(nw.lens), rep2.Damaged)
	}
	for _, r := range rep2.Sequences {
		if err := l2.Claim(ctx, r.Key, r.Seq); err != nil {
			return "", err
		}
		if err := nw.check(l2, r.Seq); err != nil {
			return "", fmt.Errorf("reopen after a clean close: %w", err)
		}
	}
	return what, nil
}

// writeErr is write returning its error.
func (w *corruptWorkload) writeErr(l *Local, rng *rand.Rand, seq uint64, n int) error {
	ctx := context.Background()
	if err := l.Create(ctx, CreateRequest{Seq: seq, Layout: plan.Layout{CP: 1, TP: 1}}); err != nil {
		return err
	}
	tok := w.cfg.KVHeads * w.cfg.HeadDim
	w.lens[seq] = n
	w.k[seq], w.v[seq] = nil, nil
	for layer := range w.cfg.Layers {
		k, v := randVec(rng, n*tok), randVec(rng, n*tok)
		if err := l.Append(ctx, AppendRequest{Seq: seq, Layer: layer, Tokens: n, K: k, V: v}); err != nil {
			return err
		}
		w.k[seq], w.v[seq] = append(w.k[seq], k), append(w.v[seq], v)
	}
	return nil
}
