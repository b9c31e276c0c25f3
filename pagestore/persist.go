package pagestore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/pagestore/disktier"
	"github.com/questrt/questrt/pagestore/tier"
)

// Durability says when a persisting store's ([Config.DataDir]) changes
// become durable; see the package doc, "Persistence".
type Durability int

const (
	// SyncOnWrite (the default): every operation that changes what is
	// persisted (Create, Fork, an Append that seals a page, Rollback,
	// Release) writes the sealed pages' payloads to their slab slots
	// (fdatasync) and commits the sequence's manifest (a bbolt
	// transaction, fsync) before it returns.
	SyncOnWrite Durability = iota
	// SyncPeriodic: those operations only mark their sequence dirty; a
	// flusher owned by the store writes the payloads of newly sealed
	// pages (write-behind), syncs the slabs and commits every dirty
	// manifest in one transaction every [Config.SyncInterval], and at
	// [Store.Sync] and [Store.Close].
	SyncPeriodic
)

// String returns "sync-on-write" or "periodic".
func (d Durability) String() string {
	switch d {
	case SyncOnWrite:
		return "sync-on-write"
	case SyncPeriodic:
		return "periodic"
	}
	return fmt.Sprintf("Durability(%d)", int(d))
}

// DefaultSyncInterval is the default [Config.SyncInterval].
const DefaultSyncInterval = time.Second

// The operations an *IOError names (see [IOError.Op]).
const (
	opCreateDir  = "create data directory"
	opOpenMeta   = "open metadata"
	opOpenSlabs  = "open page slabs"
	opOpenLens   = "open lengths file"
	opRecover    = "recover"
	opWritePage  = "write page"
	opSyncSlabs  = "sync page slabs"
	opCommit     = "commit metadata"
	opLengths    = "write lengths file"
	opSaveClose  = "save sequence at close"
	opCloseFiles = "close data directory"
)

// File names in a data directory (see the package doc, "Persistence").
const (
	storeDBName = "store.db"
	lengthsName = "lengths"
)

// castagnoli is the CRC32C table of the payloads' and the lengths
// file's checksums (the manifests' own are metastore's).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// RecoveryReport says what [New] found in a data directory.
type RecoveryReport struct {
	// Dir is the data directory; empty when the store does not persist.
	Dir string
	// Sequences are the recovered sequences, by increasing id: each has
	// its old id, page table (shared pages shared again), lengths and
	// summaries.
	Sequences []RecoveredSeq
	// Damaged are the sequences found but not recovered: a manifest, a
	// table, a slot record or a page payload failed its checksum or its
	// checks. Their pages are never used.
	Damaged []DamagedSeq
	// CorruptSlots are the slab slots whose payload or record failed its
	// check.
	CorruptSlots []int
	// LengthsFormat is the format of the lengths file at open: 0 for a
	// new directory, 1 for one written before the per-layer record
	// (only the longest layer's length is known: HadLens nil), 2 for
	// the per-layer record. It is format 2 after the open.
	LengthsFormat int
	// Lengths, when not nil, says which length records failed their
	// checks (a damaged lengths file: its header, a record, a layer's
	// entry; each wraps tier.ErrCorrupt): the losses of those
	// sequences or layers are unknown (LostTokens may be too low,
	// HadLens -1). Nothing else is affected.
	Lengths error
	// OrphanSlots counts slab slots that no manifest named (written
	// after the last commit, or of pages freed since); they were freed.
	OrphanSlots int
	// Pages is the number of physical pages the recovered sequences hold.
	Pages int
	// BadSummaries are the slab slots whose persisted summary record
	// failed its checksum or differed from the summaries of the keys
	// read at open; it was rewritten from the keys. (A directory of the
	// code before summary records gets its records written at its first
	// open, not counted here.)
	BadSummaries []int
	// Pending is the number of recovered pages whose payload was not
	// read at open ([VerifyOnRead]: their summaries came from their
	// summary records); each is read and checked at its sequence's
	// first use or by the scrub ([Store.Scrub]). 0 with VerifyAtOpen.
	Pending int
	// PayloadBytesRead is the number of page payload bytes read from
	// the slabs at open: every page's with VerifyAtOpen, those without
	// a usable summary record with VerifyOnRead.
	PayloadBytesRead int64
}

// RecoveredSeq is one recovered sequence.
type RecoveredSeq struct {
	ID SeqID
	// Len is the recovered length (the same in every layer after a crash;
	// the layers' lengths at a graceful Close otherwise).
	Len int
	// Pages is the page count; Shared of them are shared with another
	// recovered sequence.
	Pages, Shared int
	// TailPersisted says that the tail page was recovered (written by a
	// graceful Close); otherwise Len is a multiple of PageSize.
	TailPersisted bool
	// LostTokens is the number of tokens the sequence held past Len when
	// the store stopped, as recorded by the last append (see the package
	// doc: exact after a process crash, a lower bound after a power
	// loss): re-append them from position Len.
	LostTokens int
	// HadLens are, per layer, the tokens the layer held when the store
	// stopped, from its length record (exact after a process crash;
	// after a power loss perhaps fewer): HadLens[l] - the layer's
	// recovered length is what it lost. -1 for a layer whose entry is
	// unknown (failed its check: RecoveryReport.Lengths); nil when no
	// per-layer record exists (a format-1 directory, a record absent
	// or damaged), where LostTokens alone, the longest layer's, is
	// known.
	HadLens []int
}

// DamagedSeq is a sequence that could not be recovered.
type DamagedSeq struct {
	ID SeqID
	// Tokens is the last length known for it (0 when unknown).
	Tokens int
	// Err says why; it wraps tier.ErrCorrupt for a failed checksum.
	Err error
}

// seqView is what a manifest records for one sequence.
type seqView struct {
	id     SeqID
	lens   []int
	slots  []int32
	lenRec int32
}

// persist is the persistence state of a store with a DataDir. mu guards
// every field but the files; lock order: a sequence, the map, the pool,
// the residency, then mu.
type persist struct {
	dir  string
	mode Durability
	db   metastore.Manifests
	dt   *disktier.Tier
	lenF *os.File

	// syncMu serializes Sync (the flusher's and callers'): a Sync that
	// ran while another held the dirty set would find it empty and
	// report success for changes not yet durable.
	syncMu     sync.Mutex
	mu         sync.Mutex
	alloc      *tier.Allocator
	pslot      []int32 // page -> slot holding its payload, -1
	psealed    []bool  // page: pslot holds it sealed (not a tail snapshot)
	hold       []bool  // slot: held by a live page
	cref       []int32 // slot: references by committed manifests
	committed  map[SeqID][]int32
	pendingRec map[int32]uint32 // written slots whose record is not committed
	pendingSum map[int32][]byte // their summary records (sumBytes)
	dirty      map[SeqID]bool
	lenFree    []int32
	lenNext    int32
	nextID     SeqID // committed
	closed     bool
	report     RecoveryReport

	bufs sync.Pool
	stop chan struct{}
	done chan struct{}

	lazy lazyState // VerifyOnRead (lazy.go)
	// pend (page -> slab slot whose payload is not read yet, -1) and
	// pendCRC (its payload checksum) are guarded by mu.
	pend      []int32
	pendCRC   []uint32
	bytesRead atomic.Int64 // payload bytes read from the slabs

	onErr   func(*IOError) // Config.OnPersistError
	closing atomic.Bool    // Close is saving the sequences
	lenBad  atomic.Bool    // the last write of the lengths file failed (reported)
	lens    lensFile       // the lengths file's format and, until recovery ends, its contents
	// fault, when set (tests), is asked before each operation on a
	// file: an error it returns is the operation's.
	fault atomic.Pointer[func(op, path string) error]
}

// do runs f, an operation op on the file path, and returns nil or its
// error as an *IOError, reported to Config.OnPersistError.
func (pr *persist) do(op, path string, f func() error) error {
	var err error
	if fp := pr.fault.Load(); fp != nil {
		err = (*fp)(op, path)
	}
	if err == nil {
		err = f()
	}
	if err == nil {
		return nil
	}
	return pr.fail(op, path, err)
}

// fail returns err of op on path as an *IOError, reported.
func (pr *persist) fail(op, path string, err error) error {
	return newIOError(pr.onErr, op, path, err, pr.closing.Load())
}

func (pr *persist) buf(n int) []byte {
	if b, ok := pr.bufs.Get().(*[]byte); ok && len(*b) == n {
		return *b
	}
	return make([]byte, n)
}

func (pr *persist) putBuf(b []byte) { pr.bufs.Put(&b) }

// openPersist opens (or creates) the data directory of s and recovers
// its sequences into s (which is empty).
func (s *Store) openPersist() error {
	c := s.cfg
	dir := c.DataDir
	fail := func(op, path string, err error) error {
		return fmt.Errorf("pagestore: open data dir: %w", newIOError(c.OnPersistError, op, path, err, false))
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(opCreateDir, dir, err)
	}
	dbPath := filepath.Join(dir, storeDBName)
	db, err := metastore.OpenBoltManifests(dbPath, metastore.Options{Timeout: 100 * time.Millisecond, MmapBytes: c.metaMmapBytes()})
	if errors.Is(err, metastore.ErrInUse) {
		return fmt.Errorf("pagestore: data dir %s: %s is locked by another store, in this process or another: %w", dir, dbPath, ErrInUse)
	}
	if errors.Is(err, metastore.ErrCorrupt) {
		// Damaged: nothing of it is read (its caller may quarantine the
		// directory and start afresh).
		return fmt.Errorf("pagestore: data dir %s: %w: %w", dir, tier.ErrCorrupt, err)
	}
	if err != nil {
		return fail(opOpenMeta, dbPath, err)
	}
	dc := disktier.DefaultConfig()
	dc.Dir = dir
	dc.Slots = 2 * c.Capacity
	dc.PayloadBytes = c.PayloadBytes()
	dc.SlotsPerFile = min(dc.SlotsPerFile, dc.Slots)
	dc.Durability = disktier.SyncOnWrite
	if c.Durability == SyncPeriodic {
		dc.Durability = disktier.SyncNone
	}
	dt, err := disktier.Open(dc)
	if err != nil {
		var fe *metastore.FormatError
		if errors.Is(err, disktier.ErrMismatch) && errors.As(db.Init(context.Background(), c.manifestFormat()), &fe) {
			// The slabs' payload size differs: say how the formats do
			// (the page types, when they differ).
			db.Close()
			return fmt.Errorf("pagestore: data dir %s: %w: %w: %s: %w", dir, ErrInvalidConfig, ErrOtherFormat, otherFormat(fe), err)
		}
		db.Close()
		if errors.Is(err, disktier.ErrInUse) {
			return fmt.Errorf("pagestore: data dir %s: %w: %w", dir, ErrInUse, err)
		}
		if errors.Is(err, disktier.ErrMismatch) {
			return fmt.Errorf("pagestore: data dir %s: %w: %w: holds pages of another geometry: %w", dir, ErrInvalidConfig, ErrOtherFormat, err)
		}
		if errors.Is(err, tier.ErrCorrupt) {
			return fmt.Errorf("pagestore: data dir %s: %w", dir, err) // a damaged index
		}
		return fail(opOpenSlabs, dir, err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, lengthsName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		dt.Close()
		db.Close()
		return fail(opOpenLens, filepath.Join(dir, lengthsName), err)
	}
	lens, err := readLensFile(lf, c.Layers)
	if err != nil {
		lf.Close()
		dt.Close()
		db.Close()
		return fail(opOpenLens, filepath.Join(dir, lengthsName), err)
	}
	pr := &persist{
		dir: dir, mode: c.Durability, db: db, dt: dt, lenF: lf, lens: lens, onErr: c.OnPersistError,
		pslot:      make([]int32, c.Capacity),
		psealed:    make([]bool, c.Capacity),
		hold:       make([]bool, dc.Slots),
		cref:       make([]int32, dc.Slots),
		committed:  map[SeqID][]int32{},
		pendingRec: map[int32]uint32{},
		pendingSum: map[int32][]byte{},
		dirty:      map[SeqID]bool{},
	}
	pr.pend, pr.pendCRC = make([]int32, c.Capacity), make([]uint32, c.Capacity)
	for p := range pr.pslot {
		pr.pslot[p], pr.pend[p] = -1, -1
	}
	pr.lazy.init()
	s.pers = pr
	if err := s.recoverAll(); err != nil {
		pr.closeFiles()
		s.pers = nil
		return err
	}
	if pr.mode == SyncPeriodic {
		pr.stop, pr.done = make(chan struct{}), make(chan struct{})
		go s.flusher(c.syncInterval())
	}
	s.startScrub()
	return nil
}

func (pr *persist) closeFiles() error {
	return errors.Join(pr.lenF.Close(), pr.dt.Close(), pr.db.Close())
}

// manifestFormat is the fixed geometry of a data directory.
func (c Config) manifestFormat() metastore.ManifestFormat {
	return metastore.ManifestFormat{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: c.PageSize, DType: c.DType}
}

// manifest is v as metastore keeps it.
func (v seqView) manifest() metastore.Manifest {
	return metastore.Manifest{ID: uint64(v.id), LenRec: v.lenRec, Lens: v.lens, Slots: v.slots}
}

// commitLocked makes views and deletions durable in one commit
// (pr.mu held), after syncing the slabs in periodic mode, then updates the
// committed references and frees the slots nothing holds.
func (pr *persist) commitLocked(views []seqView, dels []SeqID, nextID SeqID) error {
	if pr.closed {
		return fmt.Errorf("%w: store closed", ErrPersist)
	}
	if pr.mode == SyncPeriodic {
		if err := pr.do(opSyncSlabs, pr.dir, func() error { return pr.dt.Sync(context.Background()) }); err != nil {
			return err
		}
	}
	b := metastore.ManifestBatch{SlotCRC: pr.pendingRec, Summaries: pr.pendingSum}
	for _, v := range views {
		b.Put = append(b.Put, v.manifest())
	}
	for _, id := range dels {
		b.Delete = append(b.Delete, uint64(id))
	}
	if nextID > pr.nextID {
		b.NextID = uint64(nextID)
	}
	err := pr.do(opCommit, filepath.Join(pr.dir, storeDBName), func() error {
		return pr.db.Commit(context.Background(), b)
	})
	if err != nil {
		return err
	}
	clear(pr.pendingRec)
	clear(pr.pendingSum)
	pr.nextID = max(pr.nextID, nextID)
	var drop []int32
	for _, v := range views {
		drop = append(drop, pr.committed[v.id]...)
		for _, sl := range v.slots {
			pr.cref[sl]++
		}
		pr.committed[v.id] = v.slots
	}
	for _, id := range dels {
		drop = append(drop, pr.committed[id]...)
		delete(pr.committed, id)
	}
	for _, sl := range drop {
		pr.cref[sl]--
		if pr.cref[sl] == 0 && !pr.hold[sl] {
			pr.freeSlotLocked(sl)
		}
	}
	return nil
}

// freeSlotLocked returns a slot nobody names to the allocator. Its bytes
// and disk tier entry stay until the slot is written again (no manifest
// names it; recovery frees such orphans).
func (pr *persist) freeSlotLocked(sl int32) {
	delete(pr.pendingRec, sl)
	delete(pr.pendingSum, sl)
	_ = pr.alloc.Release(int(sl))
}

func (pr *persist) unholdLocked(sl int32) {
	pr.hold[sl] = false
	if pr.cref[sl] == 0 {
		pr.freeSlotLocked(sl)
	}
}

// dropPage forgets page p's slot: p was freed or is written again.
func (pr *persist) dropPage(p int32) {
	pr.mu.Lock()
	pr.dropPendingLocked(p)
	if sl := pr.pslot[p]; sl >= 0 {
		pr.unholdLocked(sl)
		pr.pslot[p] = -1
	}
	pr.psealed[p] = false
	pr.mu.Unlock()
}

// writeSlot writes page p's current payload to a fresh slot and makes p
// hold it (sq locked, so the page's contents are stable).
func (s *Store) writeSlot(p int32, sealed bool) error {
	pr := s.pers
	b := pr.buf(s.cfg.PayloadBytes())
	defer pr.putBuf(b)
	if err := s.payload(p, b); err != nil {
		return err
	}
	pr.mu.Lock()
	if pr.closed {
		pr.mu.Unlock()
		return fmt.Errorf("%w: store closed", ErrPersist)
	}
	sl, err := pr.alloc.Alloc()
	pr.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: page %d: %w", ErrPersist, p, err)
	}
	if err := pr.do(opWritePage, pr.dir, func() error { return pr.dt.Write(context.Background(), sl, b) }); err != nil {
		pr.mu.Lock()
		_ = pr.alloc.Release(sl)
		pr.mu.Unlock()
		return fmt.Errorf("page %d: %w", p, err)
	}
	crc := crc32.Checksum(b, castagnoli)
	// Summary records serve VerifyOnRead's opens only: a VerifyAtOpen
	// store writes none, and a later VerifyOnRead open reads such pages
	// once and writes their records then. (They cost a 1,024-page
	// append and sync 8-50% while bbolt remapped store.db as it grew;
	// a VerifyOnRead store maps it whole at open, metaMmapBytes, and
	// the cost is within the noise: bench/results.)
	var sum []byte
	if s.cfg.Verify == VerifyOnRead {
		sum = s.sumBytes(p, nil)
	}
	pr.mu.Lock()
	if old := pr.pslot[p]; old >= 0 {
		pr.unholdLocked(old)
	}
	pr.pslot[p], pr.psealed[p] = int32(sl), sealed
	pr.hold[sl] = true
	pr.pendingRec[int32(sl)] = crc
	if sum != nil {
		pr.pendingSum[int32(sl)] = sum
	} else {
		delete(pr.pendingSum, int32(sl))
	}
	pr.mu.Unlock()
	return nil
}

// payload packs page p's K/V in the tier layout into b, from the pool,
// its device slot or the offload tier.
func (s *Store) payload(p int32, b []byte) error {
	if s.res == nil {
		h := s.host
		if h.fp8 {
			packFP8(h.layers, h.pageBlk, s.cfg.KVHeads, p, b)
			return nil
		}
		packTo(h.layers, h.pageBlk, p, b)
		return nil
	}
	return s.res.payload(context.Background(), p, b)
}

func (r *residency) payload(ctx context.Context, p int32, b []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sl := r.slot[p]; sl >= 0 {
		if r.fp8 {
			packFP8(r.layers, r.blk, r.heads, sl, b)
			return nil
		}
		packTo(r.layers, r.blk, sl, b)
		return nil
	}
	if r.clean[p] {
		return r.tier.Read(ctx, int(p), b)
	}
	clear(b)
	return nil
}

// packTo copies slot s's K/V of every layer into b: layer-major, K then
// V, little-endian float32 (residency.pack's layout).
func packTo(layers []LayerData, blk int, s int32, b []byte) {
	o := int(s) * blk
	for _, ld := range layers {
		for _, a := range [2][]float32{ld.K[o : o+blk], ld.V[o : o+blk]} {
			for i, x := range a {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
			}
			b = b[4*blk:]
		}
	}
}

// packFP8 copies page p's fp8 records of every layer into b: per layer,
// the K codes (KVHeads x PageSize x HeadDim bytes), the K scales
// (KVHeads little-endian float32), then the V codes and scales
// (tier.PagePayloadBytes's fp8 layout).
func packFP8(layers []LayerData, blk, heads int, p int32, b []byte) {
	o, r := int(p)*blk, int(p)*heads
	for _, ld := range layers {
		for _, a := range [2]struct {
			codes  []uint8
			scales []float32
		}{{ld.K8, ld.KScale}, {ld.V8, ld.VScale}} {
			b = b[copy(b, a.codes[o:o+blk]):]
			for _, x := range a.scales[r : r+heads] {
				binary.LittleEndian.PutUint32(b, math.Float32bits(x))
				b = b[4:]
			}
		}
	}
}

func minLen(lens []int) int {
	n := lens[0]
	for _, l := range lens[1:] {
		n = min(n, l)
	}
	return n
}

func maxLen(lens []int) int {
	n := lens[0]
	for _, l := range lens[1:] {
		n = max(n, l)
	}
	return n
}

// sealPages writes the payloads of sq's pages sealed in every layer that
// hold no sealed slot yet (sq locked) and returns its manifest view.
func (s *Store) sealPages(id SeqID, sq *seq) (seqView, error) {
	pr := s.pers
	sealed := minLen(sq.lens) / s.cfg.PageSize
	for i := sq.sealedUpTo; i < sealed; i++ {
		p := sq.pages[i]
		pr.mu.Lock()
		done := pr.psealed[p]
		pr.mu.Unlock()
		if !done {
			if err := s.writeSlot(p, true); err != nil {
				return seqView{}, err
			}
		}
		sq.sealedUpTo = i + 1
	}
	v := seqView{id: id, lens: make([]int, len(sq.lens)), slots: make([]int32, sealed), lenRec: sq.lenRec}
	for l := range v.lens {
		v.lens[l] = sealed * s.cfg.PageSize
	}
	pr.mu.Lock()
	for i := range sealed {
		v.slots[i] = pr.pslot[sq.pages[i]]
	}
	pr.mu.Unlock()
	return v, nil
}

// persistSeq records a change of sq's persisted state (sq locked): in
// SyncOnWrite mode it writes and commits now, in periodic mode it marks
// sq dirty for the flusher.
func (s *Store) persistSeq(id SeqID, sq *seq) error {
	pr := s.pers
	if pr.mode == SyncPeriodic {
		if !sq.dirty {
			sq.dirty = true
			pr.mu.Lock()
			pr.dirty[id] = true
			pr.mu.Unlock()
		}
		return nil
	}
	// A failure leaves sq unsaved: its next append persists again,
	// whether a page sealed or not (a full disk that has space again).
	sq.unsaved = true
	v, err := s.sealPages(id, sq)
	if err != nil {
		return err
	}
	next := s.peekNextID()
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if err := pr.commitLocked([]seqView{v}, nil, next); err != nil {
		return err
	}
	sq.unsaved = false
	return nil
}

// persistRelease records that id was released.
func (s *Store) persistRelease(id SeqID, sq *seq) error {
	pr := s.pers
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if sq.lenRec >= 0 {
		pr.lenFree = append(pr.lenFree, sq.lenRec)
		pr.writeLens(make([]byte, pr.lens.recSize), pr.lens.recOff(sq.lenRec))
		sq.lenRec = -1
	}
	if pr.mode == SyncPeriodic {
		pr.dirty[id] = true
		return nil
	}
	return pr.commitLocked(nil, []SeqID{id}, 0)
}

func (s *Store) peekNextID() SeqID {
	s.seqMu.RLock()
	defer s.seqMu.RUnlock()
	return s.nextID
}

// newLenRec gives a new sequence its length record (see noteLen).
func (s *Store) newLenRec(sq *seq) {
	pr := s.pers
	pr.mu.Lock()
	if n := len(pr.lenFree); n > 0 {
		sq.lenRec = pr.lenFree[n-1]
		pr.lenFree = pr.lenFree[:n-1]
	} else {
		sq.lenRec = pr.lenNext
		pr.lenNext++
	}
	pr.mu.Unlock()
}

// Sync makes every change of a persisting store durable now (the
// periodic flush; SyncOnWrite has nothing pending). Without
// [Config.DataDir] it does nothing.
func (s *Store) Sync(ctx context.Context) error {
	pr := s.pers
	if pr == nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	pr.syncMu.Lock()
	defer pr.syncMu.Unlock()
	pr.mu.Lock()
	ids := make([]SeqID, 0, len(pr.dirty))
	for id := range pr.dirty {
		ids = append(ids, id)
	}
	clear(pr.dirty)
	pr.mu.Unlock()
	var views []seqView
	var dels, failed []SeqID
	var errs []error
	for _, id := range ids {
		sq, err := s.lock(id)
		if err != nil {
			dels = append(dels, id)
			continue
		}
		sq.dirty = false
		v, err := s.sealPages(id, sq)
		sq.mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("sync seq %d: %w", id, err))
			failed = append(failed, id)
			continue
		}
		views = append(views, v)
	}
	next := s.peekNextID()
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for _, id := range failed {
		pr.dirty[id] = true // the next flush tries again
	}
	var known []SeqID
	for _, id := range dels {
		if _, ok := pr.committed[id]; ok {
			known = append(known, id)
		}
	}
	if len(views) > 0 || len(known) > 0 || len(pr.pendingRec) > 0 {
		if err := pr.commitLocked(views, known, next); err != nil {
			errs = append(errs, err)
			for _, id := range ids {
				pr.dirty[id] = true
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pagestore: sync: %w", err)
	}
	return nil
}

// flusher runs Sync every interval until Close.
func (s *Store) flusher(every time.Duration) {
	pr := s.pers
	defer close(pr.done)
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		select {
		case <-pr.stop:
			return
		case <-tk.C:
			_ = s.Sync(context.Background()) // retried at the next tick
		}
	}
}

// closePersist persists every sequence in full (tail pages included) and
// closes the data directory's files. The store must be quiet.
func (s *Store) closePersist() error {
	pr := s.pers
	s.stopScrub()
	if pr.stop != nil {
		close(pr.stop)
		<-pr.done
		pr.stop = nil
	}
	pr.mu.Lock()
	closed := pr.closed
	pr.mu.Unlock()
	if closed {
		return nil
	}
	pr.closing.Store(true) // the failures from here on are a Close's
	var views []seqView
	var errs []error
	s.seqMu.RLock()
	ids := make([]SeqID, 0, len(s.seqs))
	for id := range s.seqs {
		ids = append(ids, id)
	}
	s.seqMu.RUnlock()
	snap := map[int32]bool{} // tail pages written by this Close
	for _, id := range ids {
		sq, err := s.lockNoLoad(id)
		if err != nil {
			continue
		}
		if sq.pend {
			// Never used since the open: its committed manifest is
			// what it holds (its payloads were not even read).
			sq.mu.Unlock()
			continue
		}
		v, err := s.sealPages(id, sq)
		if err == nil {
			for _, p := range sq.pages[len(v.slots):] {
				if !snap[p] {
					if err = s.writeSlot(p, false); err != nil {
						break
					}
					snap[p] = true
				}
			}
		}
		if err == nil {
			copy(v.lens, sq.lens)
			pr.mu.Lock()
			for _, p := range sq.pages[len(v.slots):] {
				v.slots = append(v.slots, pr.pslot[p])
			}
			pr.mu.Unlock()
			views = append(views, v)
		} else {
			errs = append(errs, fmt.Errorf("seq %d: %w", id, pr.fail(opSaveClose, pr.dir, err)))
		}
		sq.mu.Unlock()
	}
	next := s.peekNextID()
	live := map[SeqID]bool{}
	for _, id := range ids {
		live[id] = true
	}
	pr.mu.Lock()
	var dels []SeqID
	for id := range pr.committed {
		if !live[id] {
			dels = append(dels, id)
		}
	}
	if err := pr.commitLocked(views, dels, next); err != nil {
		errs = append(errs, err)
	}
	pr.closed = true
	pr.mu.Unlock()
	if err := pr.closeFiles(); err != nil {
		errs = append(errs, pr.fail(opCloseFiles, pr.dir, err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pagestore: close: not every sequence saved in full: %w", err)
	}
	return nil
}

// Recovery returns what [New] recovered from [Config.DataDir] (a zero
// report without one).
func (s *Store) Recovery() RecoveryReport {
	if s.pers == nil {
		return RecoveryReport{}
	}
	return s.pers.report
}
