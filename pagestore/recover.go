package pagestore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"

	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/pagestore/tier"
)

// recoverAll reads the data directory into the empty store s: every
// sequence whose manifest, tables, slot records and payloads pass their
// checks comes back with its id, lengths and pages (shared pages shared,
// refcounts the number of recovered sequences naming them), summaries
// recomputed from the recovered keys; the others are reported damaged.
// Then it rewrites the directory to what was recovered: damaged
// manifests are deleted and slots nothing names are freed.
func (s *Store) recoverAll() error {
	pr := s.pers
	c := s.cfg
	rep := RecoveryReport{Dir: pr.dir}
	type found struct {
		v      seqView
		nslots int
		err    error
	}
	var seqs []found
	ctx := context.Background()
	dbPath := filepath.Join(pr.dir, storeDBName)
	if err := pr.db.Init(ctx, c.manifestFormat()); err != nil {
		var fe *metastore.FormatError
		if errors.As(err, &fe) {
			return fmt.Errorf("pagestore: data dir %s: %w: %w: %s", pr.dir, ErrInvalidConfig, ErrOtherFormat, otherFormat(fe))
		}
		return fmt.Errorf("pagestore: open data dir: %w", pr.fail(opRecover, dbPath, err))
	}
	ld, err := pr.db.Load(ctx)
	if err != nil {
		return fmt.Errorf("pagestore: open data dir: %w", pr.fail(opRecover, dbPath, err))
	}
	nextID := SeqID(ld.NextID)
	slotRec, badRec := ld.SlotCRC, ld.BadSlots
	for _, r := range ld.Manifests {
		m := r.Manifest
		seqs = append(seqs, found{v: seqView{id: SeqID(m.ID), lens: m.Lens, slots: m.Slots, lenRec: m.LenRec}, nslots: len(m.Slots), err: r.Err})
	}

	// Check every sequence's pages, reading each slot once.
	S := c.PageSize
	nslot := pr.dt.Slots()
	type slotState struct {
		page int32 // physical page, -1 not assigned
		err  error
	}
	state := map[int32]*slotState{}
	buf := make([]byte, c.PayloadBytes())
	corrupt := map[int]bool{}
	sumFix := map[int32][]byte{} // summary records to (re)write
	var good []found
	slices.SortFunc(seqs, func(a, b found) int { return cmp.Compare(a.v.id, b.v.id) })
	for _, f := range seqs {
		if f.err == nil {
			f.err = s.checkView(f.v, f.nslots)
		}
		for i := 0; f.err == nil && i < len(f.v.slots); i++ {
			sl := f.v.slots[i]
			if sl < 0 || int(sl) >= nslot {
				f.err = fmt.Errorf("page %d in slot %d outside the %d slots: %w", i, sl, nslot, tier.ErrCorrupt)
				break
			}
			st := state[sl]
			if st == nil {
				st = &slotState{page: -1}
				state[sl] = st
				st.err = badRec[sl]
				crc, ok := slotRec[sl]
				if st.err == nil && !ok {
					st.err = fmt.Errorf("slot %d has no record: %w", sl, tier.ErrCorrupt)
				}
				sum, hasSum := ld.Summaries[sl]
				lazy := c.Verify == VerifyOnRead && hasSum && len(sum) == s.sumLen()
				if st.err == nil && !lazy {
					st.err = pr.readSlot(ctx, sl, crc, buf)
				}
				if st.err != nil {
					corrupt[int(sl)] = true
				} else if len(s.free) == 0 {
					st.err = fmt.Errorf("slot %d: %w: the pool of %d pages is full", sl, ErrPoolExhausted, c.Capacity)
				} else if lazy {
					// Summaries only: the payload is read at first use
					// or by the scrub (see lazy.go).
					p := s.popLocked()
					s.ref[p] = 0
					s.setSum(p, sum)
					pr.pend[p], pr.pendCRC[p] = sl, crc
					st.page = p
				} else {
					p := s.popLocked()
					s.ref[p] = 0
					if err := s.restorePage(p, buf, i, f.v.lens); err != nil {
						return fmt.Errorf("pagestore: data dir %s: restore page: %w", pr.dir, err)
					}
					st.page = p
					// The summary record: checked against the keys and
					// rewritten when wrong; written when absent only by
					// a VerifyOnRead store (a directory of the code
					// before summary records, or of a VerifyAtOpen
					// store, which writes none: see writeSlot).
					if hasSum || ld.BadSummaries[sl] != nil || c.Verify == VerifyOnRead {
						got := s.sumBytes(p, nil)
						if !hasSum || !bytes.Equal(got, sum) {
							if hasSum || ld.BadSummaries[sl] != nil {
								rep.BadSummaries = append(rep.BadSummaries, int(sl))
							}
							sumFix[sl] = got
						}
					}
				}
			}
			if st.err != nil {
				f.err = fmt.Errorf("page %d: %w", i, st.err)
			}
		}
		if f.err != nil {
			tok := maxLen(append([]int{0}, f.v.lens...))
			if _, n, err := pr.lens.read(f.v.id, f.v.lenRec); err == nil && n > tok {
				tok = n
			}
			rep.Damaged = append(rep.Damaged, DamagedSeq{ID: f.v.id, Tokens: tok, Err: f.err})
			continue
		}
		good = append(good, f)
	}

	// Install the good sequences.
	used := map[int32]bool{}
	var maxRec int32 = -1
	for _, f := range good {
		v := f.v
		sq := &seq{lens: v.lens, lenRec: v.lenRec, pages: make([]int32, len(v.slots))}
		for i, sl := range v.slots {
			p := state[sl].page
			sq.pages[i] = p
			s.ref[p]++
			used[sl] = true
			pr.pslot[p] = sl
			pr.hold[sl] = true
			pr.cref[sl]++
		}
		for _, p := range sq.pages {
			if pr.pend[p] >= 0 {
				sq.pend = true
			}
		}
		sq.sealedUpTo = minLen(v.lens) / S
		for _, p := range sq.pages[:sq.sealedUpTo] {
			pr.psealed[p] = true
		}
		pr.committed[v.id] = v.slots
		maxRec = max(maxRec, v.lenRec)
		s.seqs[v.id] = sq
		nextID = max(nextID, v.id+1)
	}
	// Pages named by damaged sequences only were popped: give them back.
	for _, st := range state {
		if st.page >= 0 && s.ref[st.page] == 0 {
			s.ref[st.page] = 1
			s.unrefLocked(st.page)
		}
	}
	// The lengths file: read from its contents at open, then written
	// afresh in format 2 when it was not (a new or format-1 directory,
	// a damaged header).
	rep.LengthsFormat = pr.lens.format
	var lenErrs []error
	if pr.lens.headErr != nil {
		lenErrs = append(lenErrs, pr.lens.headErr)
	}
	type lenRead struct {
		lens []int
		hi   int
	}
	lread := make([]lenRead, len(good))
	for i, f := range good {
		lens, hi, err := pr.lens.read(f.v.id, f.v.lenRec)
		if err != nil && !errors.Is(err, errNoRecord) && pr.lens.headErr == nil {
			lenErrs = append(lenErrs, fmt.Errorf("seq %d: %w", f.v.id, err))
		}
		lread[i] = lenRead{lens, hi}
	}
	rep.Lengths = errors.Join(lenErrs...)
	if pr.lens.format != lensFormat2 || pr.lens.headErr != nil {
		if err := pr.resetLens(); err != nil {
			return fmt.Errorf("pagestore: open data dir: %w", err)
		}
	}
	pr.lens.raw = nil
	for i, f := range good {
		sq := s.seqs[f.v.id]
		s.setPins(sq, sq.pages)
		r := RecoveredSeq{ID: f.v.id, Len: minLen(sq.lens), Pages: len(sq.pages), TailPersisted: maxLen(sq.lens)%S != 0 || len(sq.pages) > sq.sealedUpTo}
		for _, p := range sq.pages {
			if s.ref[p] > 1 {
				r.Shared++
			}
		}
		if n := lread[i].hi; n > maxLen(sq.lens) {
			r.LostTokens = n - maxLen(sq.lens)
		}
		if lens := lread[i].lens; lens != nil {
			// A layer whose entry is unknown (-1) stays unknown; one
			// recorded shorter than its persisted pages (a record
			// older than them: a failed write) is not trusted either.
			r.HadLens = make([]int, len(lens))
			for l, n := range lens {
				r.HadLens[l] = -1
				if n >= sq.lens[l] {
					r.HadLens[l] = n
				}
			}
		}
		s.noteLen(f.v.id, sq) // the lost tokens are reported once
		rep.Sequences = append(rep.Sequences, r)
	}
	rep.Pages = c.Capacity - len(s.free)
	s.nextID = max(nextID, 1)

	// Length records: those of recovered sequences stay in use.
	pr.lenNext = maxRec + 1
	inUse := map[int32]bool{}
	for _, f := range good {
		inUse[f.v.lenRec] = true
	}
	for r := int32(0); r < pr.lenNext; r++ {
		if !inUse[r] {
			pr.lenFree = append(pr.lenFree, r)
		}
	}
	if err := pr.do(opRecover, pr.lenF.Name(), func() error {
		if err := pr.lenF.Truncate(pr.lens.recOff(pr.lenNext)); err != nil {
			return err
		}
		if rep.LengthsFormat != lensFormat2 {
			return pr.lenF.Sync() // once, for the new header
		}
		return nil
	}); err != nil {
		return fmt.Errorf("pagestore: open data dir: %w", err)
	}
	for sl := range corrupt {
		rep.CorruptSlots = append(rep.CorruptSlots, sl)
	}
	slices.Sort(rep.CorruptSlots)

	// Rewrite the directory to what was recovered.
	var keep []int
	for _, sl := range pr.dt.Used() {
		if used[int32(sl)] {
			keep = append(keep, sl)
			continue
		}
		if err := pr.dt.Free(ctx, sl); err != nil && !errors.Is(err, tier.ErrEmpty) {
			return fmt.Errorf("pagestore: open data dir: free orphan slot %d: %w", sl, pr.fail(opRecover, pr.dir, err))
		}
		rep.OrphanSlots++
	}
	if err := pr.do(opRecover, pr.dir, func() error { return pr.dt.Sync(ctx) }); err != nil {
		return fmt.Errorf("pagestore: open data dir: %w", err)
	}
	alloc, err := tier.NewAllocator(nslot, keep...)
	if err != nil {
		return fmt.Errorf("pagestore: data dir %s: %w: %w", pr.dir, ErrPersist, err)
	}
	pr.alloc = alloc
	b := metastore.ManifestBatch{RetainSlots: used, NextID: uint64(s.nextID)}
	for sl, sum := range sumFix {
		if used[sl] {
			if b.SlotCRC == nil {
				b.SlotCRC, b.Summaries = map[int32]uint32{}, map[int32][]byte{}
			}
			b.SlotCRC[sl], b.Summaries[sl] = slotRec[sl], sum
		}
	}
	slices.Sort(rep.BadSummaries)
	for _, d := range rep.Damaged {
		b.Delete = append(b.Delete, uint64(d.ID))
	}
	err = pr.db.Commit(ctx, b)
	if err != nil {
		return fmt.Errorf("pagestore: open data dir: %w", pr.fail(opRecover, filepath.Join(pr.dir, storeDBName), err))
	}
	pr.nextID = s.nextID
	for _, st := range state {
		if st.page >= 0 && pr.pend[st.page] >= 0 && s.ref[st.page] > 0 {
			rep.Pending++
		}
	}
	rep.PayloadBytesRead = pr.bytesRead.Load()
	pr.report = rep
	return nil
}

// checkView checks a manifest's lengths against its page count.
func (s *Store) checkView(v seqView, n int) error {
	S := s.cfg.PageSize
	if len(v.slots) != n {
		return fmt.Errorf("manifest names %d pages, tables hold %d: %w", n, len(v.slots), tier.ErrCorrupt)
	}
	hi := maxLen(v.lens)
	if (hi+S-1)/S != n || v.lenRec < 0 {
		return fmt.Errorf("manifest: lengths %v with %d pages: %w", v.lens, n, tier.ErrCorrupt)
	}
	return nil
}

// restoreFP8 is restorePage for fp8 records (packFP8's layout): codes
// and scales as they were stored (in the pool without offload; the
// caller writes the payload to the tier with it), summaries over the
// dequantized keys.
func (s *Store) restoreFP8(p int32, b []byte, idx int, lens []int) {
	h := s.host
	S, H := s.cfg.PageSize, s.cfg.KVHeads
	if s.res == nil {
		unpackFP8(h.layers, h.pageBlk, H, p, b)
	}
	x := make([]float32, h.headBlk)
	lb := fp8LayerBytes(h.pageBlk, H)
	for l, ld := range h.layers {
		kb := b[l*lb:]
		valid := min(max(lens[l]-idx*S, 0), S)
		for hd := 0; hd < H; hd++ {
			sc := math.Float32frombits(binary.LittleEndian.Uint32(kb[h.pageBlk+4*hd:]))
			h.summarizeCodes(ld, int(p), hd, kb[hd*h.headBlk:(hd+1)*h.headBlk], sc, valid, x)
		}
	}
}

// restorePage puts a recovered payload into physical page p (logical
// page idx of a sequence with lengths lens) and recomputes its summaries
// from the valid keys of each layer, in slot order: what the appends
// computed, bit for bit (min and max are exact).
func (s *Store) restorePage(p int32, b []byte, idx int, lens []int) error {
	h := s.host
	if h.fp8 {
		s.restoreFP8(p, b, idx, lens)
	} else {
		s.restoreF32(p, b, idx, lens)
	}
	if s.res != nil {
		r := s.res
		r.mu.Lock()
		defer r.mu.Unlock()
		if err := r.tier.Write(context.Background(), int(p), b); err != nil {
			return err
		}
		r.clean[p] = true
		r.ntier++
	}
	return nil
}

// restoreF32 is restorePage for float32 pages: K/V into the pool
// without offload, summaries from the valid keys.
func (s *Store) restoreF32(p int32, b []byte, idx int, lens []int) {
	h := s.host
	S, D := s.cfg.PageSize, s.cfg.HeadDim
	blk := h.pageBlk
	k := make([]float32, blk)
	for l, ld := range h.layers {
		off := l * 2 * 4 * blk
		for i := range k {
			k[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[off+4*i:]))
		}
		if s.res == nil {
			copy(ld.K[int(p)*blk:], k)
			v := ld.V[int(p)*blk : int(p+1)*blk]
			for i := range v {
				v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[off+4*blk+4*i:]))
			}
		}
		valid := min(max(lens[l]-idx*S, 0), S)
		for hd := 0; hd < s.cfg.KVHeads; hd++ {
			so := int(p)*h.sumPage + hd*h.sumRec
			mn := ld.Summary[so : so+D : so+D]
			mx := ld.Summary[so+D : so+2*D : so+2*D]
			empty(mn, mx)
			for r := range valid {
				o := hd*h.headBlk + r*D
				widen(mn, mx, k[o:o+D])
			}
		}
	}
}

// otherFormat says how a data directory's format record differs from the
// config's: the page types when they differ (fp8 against f32), else the
// records.
func otherFormat(fe *metastore.FormatError) string {
	if have, want := metastore.ManifestFormatDType(fe.Have), metastore.ManifestFormatDType(fe.Want); have != want {
		return fmt.Sprintf("data directory holds %v pages, the config asks for %v", have, want)
	}
	return fmt.Sprintf("data directory holds pages of another geometry (format %x, config %x)", fe.Have, fe.Want)
}
