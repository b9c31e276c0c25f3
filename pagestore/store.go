package pagestore

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
)

// SeqID names a sequence of one store. Ids are assigned by [Store.Create],
// starting at 1; 0 is never a valid id.
type SeqID uint64

// LayerData holds the whole pool arrays of one layer; kernels index them with
// physical page ids (see the package doc for the layout). They alias the
// store's memory: no copy is made.
type LayerData struct {
	// K and V are [Capacity][KVHeads][PageSize][HeadDim] (nil for
	// plan.FP8).
	K, V []float32
	// K8 and V8 are, for plan.FP8, K and V as E4M3 codes in the layout
	// of K and V, and KScale and VScale the scales of their (page, KV
	// head) records, [Capacity][KVHeads] (kernels.Layer's fields of the
	// same names); nil otherwise.
	K8, V8         []uint8
	KScale, VScale []float32
	// Summary is [Capacity][KVHeads][2][HeadDim]: mins then maxes.
	Summary []float32
	// Sub, when Config.SubBoxes = c > 1, is [Capacity][KVHeads][c][2]
	// [HeadDim]: sub-box i of a (page, KV head) is the min/max box of
	// its token slots [i*S/c, (i+1)*S/c) that hold valid keys (the empty
	// box, +Inf minima and -Inf maxima, when none does). nil otherwise.
	Sub []float32
}

// SeqView is what a kernel needs about one sequence in one layer besides
// its page table. It holds no slices, so getting one does not allocate.
type SeqView struct {
	// Len is the number of tokens of the layer.
	Len int
	// Pages is the number of pages holding at least one valid token of the
	// layer: the first Pages entries of the page table.
	Pages int
	// LastPageLen is the number of valid tokens in page Pages-1 (1..S), or 0
	// when Len is 0.
	LastPageLen int
}

// Stats is a snapshot of the pool.
type Stats struct {
	Capacity     int // pages in the pool
	FreePages    int // pages on the free list
	UsedPages    int // pages with refcount >= 1
	SharedPages  int // pages with refcount >= 2 (fork sharing)
	Sequences    int // live sequences
	KVBytes      int // bytes of the K and V pools, all layers
	SummaryBytes int // bytes of the summary pools, all layers
}

// Store is the paged KV store of one device partition. See the package doc
// for the layout and the concurrency contract.
type Store struct {
	cfg  Config
	sz   sizes
	tok  int        // KVHeads*HeadDim: one token of k or v passed to Append
	data PageData   // the page contents
	host *hostData  // data, when it is the store's own host arrays
	res  *residency // the device pool of an offloading store, or nil
	pers *persist   // the data directory of a persisting store, or nil

	poolMu sync.Mutex
	free   []int32 // stack of free physical pages
	ref    []int32 // refcount per physical page
	inv    invScratch

	seqMu  sync.RWMutex
	seqs   map[SeqID]*seq
	nextID SeqID
}

type seq struct {
	mu       sync.Mutex
	released bool
	pages    []int32   // logical page -> physical page
	lens     []int     // tokens per layer
	cow      []cowPage // Append scratch: shared pages to copy
	fresh    []int32   // Append scratch: pages taken for new slots
	valid    []int     // copyPage scratch: valid slots per layer
	pinned   []int32   // offload: the pages this sequence pins
	pinBuf   []int32   // setPins scratch
	cuts     uint64    // Rollback and Truncate cuts (Store.Cuts)

	// Persistence (Config.DataDir).
	sealedUpTo int   // leading pages whose payload holds a sealed slot
	lenRec     int32 // index of the sequence's length record
	lenStale   bool  // a write of its length record failed: rewrite it whole
	dirty      bool  // periodic: queued for the flusher
	unsaved    bool  // sync-on-write: its last persist failed
	pend       bool  // VerifyOnRead: pages whose payload is not read yet
}

type cowPage struct {
	idx      int // logical page
	old, new int32
}

// New allocates a store with every pool array of cfg in host memory.
func New(cfg Config) (*Store, error) {
	sz, err := cfg.sizes()
	if err != nil {
		return nil, err
	}
	if cfg.DType != plan.Float32 && cfg.DType != plan.FP8 {
		return nil, fmt.Errorf("%w: dtype %v is reserved for the GPU backend; the CPU page store holds f32 or fp8", ErrInvalidConfig, cfg.DType)
	}
	need, _ := cfg.HostBytes()
	what := fmt.Sprintf("page pools of %d pages x %d layers x %d KV heads x %d slots x D %d", cfg.Capacity, cfg.Layers, cfg.KVHeads, cfg.PageSize, cfg.HeadDim)
	if err := memlimit.Check(what, need, cfg.MemoryLimit); err != nil {
		return nil, fmt.Errorf("pagestore: %w", err)
	}
	h := newHostData(cfg, sz)
	s := newStore(cfg, sz, h)
	s.host = h
	if cfg.Offload() {
		r, err := newResidency(cfg, h.layers, nil)
		if err != nil {
			return nil, err
		}
		h.res, s.res = r, r
	}
	all := make([]int32, cfg.Capacity)
	for p := range all {
		all[p] = int32(p)
	}
	h.Reset(all)
	if cfg.DataDir != "" {
		if err := s.openPersist(); err != nil {
			if s.res != nil && s.res.ownTier {
				s.res.tier.Close()
			}
			return nil, err
		}
	}
	return s, nil
}

// NewWithData makes a store whose page contents live in data (a device's
// memory, say): the store keeps only the metadata on the host. data must
// hold cfg.Capacity pages of cfg's geometry; the store resets a page's
// summaries when it hands the page out. [Store.Layer], [Store.PageKV] and
// [Store.PageSummary] are then unavailable (see [Store.HostPages]).
// Offload ([Config.DeviceBudget]) needs [NewWithSlots] instead.
func NewWithData(cfg Config, data PageData) (*Store, error) {
	sz, err := cfg.sizes()
	if err != nil {
		return nil, err
	}
	if cfg.Offload() {
		return nil, fmt.Errorf("%w: DeviceBudget %d: offload needs the store's own pools (New), not outside page data", ErrInvalidConfig, cfg.DeviceBudget)
	}
	if data == nil {
		return nil, fmt.Errorf("%w: nil page data", ErrInvalidConfig)
	}
	if cfg.SubBoxes > 1 {
		return nil, fmt.Errorf("%w: SubBoxes %d: sub-box summaries need the store's own host pools (New), not outside page data", ErrInvalidConfig, cfg.SubBoxes)
	}
	if cfg.DataDir != "" {
		return nil, fmt.Errorf("%w: DataDir %q: persistence needs the store's own pools (New), not outside page data", ErrInvalidConfig, cfg.DataDir)
	}
	return newStore(cfg, sz, data), nil
}

func newStore(cfg Config, sz sizes, data PageData) *Store {
	s := &Store{
		cfg:    cfg,
		sz:     sz,
		tok:    cfg.KVHeads * cfg.HeadDim,
		data:   data,
		free:   make([]int32, cfg.Capacity),
		ref:    make([]int32, cfg.Capacity),
		seqs:   make(map[SeqID]*seq),
		nextID: 1,
	}
	// Pop from the end: page 0 is handed out first.
	for i := range s.free {
		s.free[i] = int32(cfg.Capacity - 1 - i)
	}
	return s
}

// Config returns the store's configuration.
func (s *Store) Config() Config { return s.cfg }

// HostPages reports whether the page contents are the store's own host
// arrays ([New]), which [Store.Layer], [Store.PageKV] and
// [Store.PageSummary] expose.
func (s *Store) HostPages() bool { return s.host != nil }

// Layer returns the whole pool arrays of layer l (no copy). It panics when l
// is out of range or the pages do not live in host memory. With offload on
// ([Config.DeviceBudget]) K and V hold DeviceBudget slots, indexed by
// [Store.DeviceSlot], and Summary every page, indexed by physical page id.
func (s *Store) Layer(l int) LayerData { return s.hostData().layers[l] }

func (s *Store) hostData() *hostData {
	if s.host == nil {
		panic("pagestore: the page contents live outside host memory (NewWithData)")
	}
	return s.host
}

// PageKV returns the [PageSize][HeadDim] K and V blocks of one physical page
// and KV head in one layer, aliasing the pool (no copy). Slots beyond the
// layer's valid length hold unspecified data. It panics on an index out of
// range, when the pages do not live in host memory, and, with offload on,
// when the page is not resident (see [Store.ReadKV]); a resident page's
// blocks are valid until the page is evicted. It panics on an fp8 store,
// whose records are no float32 blocks ([Store.ReadKV] dequantizes them).
func (s *Store) PageKV(layer, phys, head int) (k, v []float32) {
	s.checkPhys(phys, head)
	h := s.hostData()
	if h.fp8 {
		panic("pagestore: PageKV on an fp8 store (its K/V are E4M3 records; use ReadKV)")
	}
	ld := h.layers[layer]
	kvp := phys
	if s.res != nil {
		if kvp = int(s.DeviceSlot(int32(phys))); kvp < 0 {
			panic(fmt.Sprintf("pagestore: page %d is not resident (offloaded to the tier)", phys))
		}
	}
	o := kvp*h.pageBlk + head*h.headBlk
	e := o + h.headBlk
	return ld.K[o:e:e], ld.V[o:e:e]
}

// PageSummary returns the HeadDim minima and maxima of one physical page and
// KV head in one layer, aliasing the pool (no copy). It panics on an index out
// of range or when the pages do not live in host memory.
func (s *Store) PageSummary(layer, phys, head int) (min, max []float32) {
	s.checkPhys(phys, head)
	h := s.hostData()
	ld := h.layers[layer]
	o := phys*h.sumPage + head*h.sumRec
	d := s.cfg.HeadDim
	return ld.Summary[o : o+d : o+d], ld.Summary[o+d : o+2*d : o+2*d]
}

// PageSubBoxes returns the Config.SubBoxes sub-box records of one
// physical page and KV head of a layer (SubBoxes x [mins, maxes], each
// HeadDim floats; see [LayerData.Sub]), or nil when the store keeps no
// sub-boxes. It aliases the store's memory and panics where
// [Store.PageSummary] does.
func (s *Store) PageSubBoxes(layer, phys, head int) []float32 {
	s.checkPhys(phys, head)
	return s.hostData().subRec(s.hostData().layers[layer], phys, head)
}

func (s *Store) checkPhys(phys, head int) {
	if phys < 0 || phys >= s.cfg.Capacity || head < 0 || head >= s.cfg.KVHeads {
		panic(fmt.Sprintf("pagestore: page %d head %d out of range [0,%d) x [0,%d)", phys, head, s.cfg.Capacity, s.cfg.KVHeads))
	}
}

// Stats returns a snapshot of the pool.
func (s *Store) Stats() Stats {
	s.seqMu.RLock()
	n := len(s.seqs)
	s.seqMu.RUnlock()
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	st := Stats{
		Capacity:     s.cfg.Capacity,
		FreePages:    len(s.free),
		UsedPages:    s.cfg.Capacity - len(s.free),
		Sequences:    n,
		KVBytes:      s.sz.kvBytes,
		SummaryBytes: s.sz.sumBytes,
	}
	for _, r := range s.ref {
		if r > 1 {
			st.SharedPages++
		}
	}
	return st
}

// Create starts an empty sequence and returns its id. A persisting store
// records it (its manifest commit is best effort: a failure is reported by
// the next operation on the sequence that persists).
func (s *Store) Create() SeqID {
	sq := &seq{lens: make([]int, s.cfg.Layers)}
	s.seqMu.Lock()
	id := s.nextID
	s.nextID++
	s.seqMu.Unlock()
	if s.pers != nil {
		s.newLenRec(sq)
		s.noteLen(id, sq)
		_ = s.persistSeq(id, sq)
	}
	s.seqMu.Lock()
	s.seqs[id] = sq
	s.seqMu.Unlock()
	return id
}

// Release ends a sequence and drops its references to its pages; pages whose
// refcount reaches zero return to the free list.
func (s *Store) Release(id SeqID) error {
	s.seqMu.Lock()
	sq, ok := s.seqs[id]
	delete(s.seqs, id)
	s.seqMu.Unlock()
	if !ok {
		return fmt.Errorf("release seq %d: %w", id, ErrUnknownSequence)
	}
	sq.mu.Lock()
	defer sq.mu.Unlock()
	s.releasePages(sq)
	if err := s.data.Drop(id); err != nil {
		return fmt.Errorf("release seq %d: %w: %w", id, ErrData, err)
	}
	if s.pers != nil {
		if err := s.persistRelease(id, sq); err != nil {
			return fmt.Errorf("release seq %d: %w", id, err)
		}
	}
	return nil
}

// releasePages marks sq (locked, already out of the map) released and
// gives its pages back: pins dropped, references counted down.
func (s *Store) releasePages(sq *seq) {
	sq.released = true
	s.setPins(sq, nil)
	s.poolMu.Lock()
	for _, p := range sq.pages {
		s.unrefLocked(p)
	}
	s.poolMu.Unlock()
	sq.pages = nil
}

// lock returns the live sequence id with its mutex held.
func (s *Store) lock(id SeqID) (*seq, error) {
	sq, err := s.lockNoLoad(id)
	if err != nil {
		return nil, err
	}
	if sq.pend { // recovered, payloads not read yet (VerifyOnRead)
		if err := s.loadSeq(sq); err != nil {
			sq.mu.Unlock()
			return nil, s.damage(id, sq, err)
		}
	}
	return sq, nil
}

// Len returns the number of tokens present in every layer of the sequence
// (the minimum of the layer lengths; between decode steps all layers agree).
// It reads no page: a recovered sequence's pages are not read and checked
// by it ([VerifyOnRead]), so a length is answered for a sequence whose
// damage the first operation reading its pages will find.
func (s *Store) Len(id SeqID) (int, error) {
	sq, err := s.lockNoLoad(id)
	if err != nil {
		return 0, fmt.Errorf("len seq %d: %w", id, err)
	}
	defer sq.mu.Unlock()
	n := sq.lens[0]
	for _, l := range sq.lens[1:] {
		n = min(n, l)
	}
	return n, nil
}

// LayerLen returns the number of tokens of one layer of the sequence. As
// [Store.Len], it reads no page.
func (s *Store) LayerLen(id SeqID, layer int) (int, error) {
	if err := s.checkLayer(layer); err != nil {
		return 0, fmt.Errorf("len seq %d layer %d: %w", id, layer, err)
	}
	sq, err := s.lockNoLoad(id)
	if err != nil {
		return 0, fmt.Errorf("len seq %d layer %d: %w", id, layer, err)
	}
	defer sq.mu.Unlock()
	return sq.lens[layer], nil
}

// AppendPageTable appends the sequence's physical page ids, in logical order,
// to dst and returns the extended slice. Every page allocated to the sequence
// is listed (a layer that is behind may use only a prefix: see [Store.View]).
// It does not allocate when dst has room.
func (s *Store) AppendPageTable(dst []int32, id SeqID) ([]int32, error) {
	sq, err := s.lock(id)
	if err != nil {
		return dst, fmt.Errorf("page table seq %d: %w", id, err)
	}
	defer sq.mu.Unlock()
	return append(dst, sq.pages...), nil
}

// View returns the length, page count and last_page_len of one layer of the
// sequence.
func (s *Store) View(id SeqID, layer int) (SeqView, error) {
	if err := s.checkLayer(layer); err != nil {
		return SeqView{}, fmt.Errorf("view seq %d layer %d: %w", id, layer, err)
	}
	sq, err := s.lock(id)
	if err != nil {
		return SeqView{}, fmt.Errorf("view seq %d layer %d: %w", id, layer, err)
	}
	defer sq.mu.Unlock()
	return s.view(sq.lens[layer]), nil
}

// Cuts returns the number of cuts of sequence id (Rollback, Truncate)
// since it was created or recovered. Between two calls that return the
// same count the only summaries that changed are those of the tail page
// seen at the first call and of pages after it (appends), so a cache
// derived from the summaries (a box tree) refreshes from there; a changed
// count means any page may have been rescanned or replaced.
func (s *Store) Cuts(id SeqID) (uint64, error) {
	sq, err := s.lock(id)
	if err != nil {
		return 0, fmt.Errorf("cuts seq %d: %w", id, err)
	}
	defer sq.mu.Unlock()
	return sq.cuts, nil
}

func (s *Store) view(n int) SeqView {
	if n == 0 {
		return SeqView{}
	}
	S := s.cfg.PageSize
	p := (n + S - 1) / S
	return SeqView{Len: n, Pages: p, LastPageLen: n - (p-1)*S}
}

func (s *Store) checkLayer(layer int) error {
	if layer < 0 || layer >= s.cfg.Layers {
		return fmt.Errorf("%w: %d not in [0,%d)", ErrLayerOutOfRange, layer, s.cfg.Layers)
	}
	return nil
}

// checkKV validates the shape and values of an append and returns the
// number of tokens.
func (s *Store) checkKV(k, v []float32) (int, error) {
	if len(k) != len(v) {
		return 0, fmt.Errorf("%w: len(k) = %d, len(v) = %d, must be equal", ErrBadShape, len(k), len(v))
	}
	if len(k) == 0 || len(k)%s.tok != 0 {
		return 0, fmt.Errorf("%w: len = %d, want a positive multiple of KVHeads*HeadDim = %d", ErrBadShape, len(k), s.tok)
	}
	if !allFinite(k) || !allFinite(v) {
		for _, x := range [2]struct {
			name string
			a    []float32
		}{{"k", k}, {"v", v}} {
			for i, f := range x.a {
				if f != f || f > math.MaxFloat32 || f < -math.MaxFloat32 {
					d := s.cfg.HeadDim
					return 0, fmt.Errorf("%w: %s[token %d][head %d][dim %d] = %v", ErrNonFinite, x.name, i/s.tok, i%s.tok/d, i%d, f)
				}
			}
		}
	}
	return len(k) / s.tok, nil
}

// allFinite reports whether a holds no NaN or infinity: x*0 is ±0 for a
// finite x and NaN otherwise, so the sums stay 0 exactly when all are
// finite. Four accumulators, no data-dependent branch.
func allFinite(a []float32) bool {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * 0
		s1 += a[i+1] * 0
		s2 += a[i+2] * 0
		s3 += a[i+3] * 0
	}
	for ; i < len(a); i++ {
		s0 += a[i] * 0
	}
	return s0+s1+s2+s3 == 0
}

// Append writes n >= 1 tokens of one layer to the end of that layer of the
// sequence. k and v are token-major [n][KVHeads][HeadDim]. Pages are
// allocated (with a fresh summary) when the layer runs past the allocated
// pages, a shared page about to be written is copied first, and every key
// widens its page's summary (eq. 8). Nothing changes when an error is
// returned: inputs and capacity are checked before any write. (The one
// exception is an error of the [PageData], wrapped in [ErrData]: the length
// is then unchanged and the pages the append took are given back, but a
// copy-on-write copy it made stays in the page table, with the same
// contents, and the tail page's summary may have been widened by keys that
// were not appended. A PageData that queues its work, as a device does,
// may report a failure at a later call instead: treat ErrData as fatal for
// the store's contents.)
func (s *Store) Append(id SeqID, layer int, k, v []float32) error {
	if err := s.checkLayer(layer); err != nil {
		return fmt.Errorf("append seq %d layer %d: %w", id, layer, err)
	}
	n, err := s.checkKV(k, v)
	if err != nil {
		return fmt.Errorf("append seq %d layer %d: %w", id, layer, err)
	}
	return s.appendN(id, layer, n, func(pages []int32, slot int) error {
		return s.data.Write(layer, pages, slot, k, v)
	})
}

// TensorData is a PageData that can also store tokens whose K and V are
// device tensors (a device's PageData, see [Store.AppendTensor]).
type TensorData interface {
	PageData
	// WriteTensor is Write with k and v in device memory.
	WriteTensor(layer int, pages []int32, slot int, k, v decode.Tensor) error
}

// AppendTensor is Append with k and v given as tensors: host tensors go
// to Append; device ones go to the data in place when it is a
// [TensorData] (the device reads them in their stream's order), and are
// refused with decode.ErrDeviceTensor otherwise. The store checks the
// shapes of device tensors, not their values (reading them would cost a
// host synchronisation).
func (s *Store) AppendTensor(id SeqID, layer int, k, v decode.Tensor) error {
	if k.OnHost() && v.OnHost() {
		return s.Append(id, layer, k.Data, v.Data)
	}
	if err := s.checkLayer(layer); err != nil {
		return fmt.Errorf("append seq %d layer %d: %w", id, layer, err)
	}
	td, ok := s.data.(TensorData)
	switch {
	case !ok || s.res != nil:
		return fmt.Errorf("append seq %d layer %d: %w: the pages are not in one device's memory", id, layer, decode.ErrDeviceTensor)
	case k.Device != v.Device:
		return fmt.Errorf("append seq %d layer %d: %w: k on %v, v on %v", id, layer, decode.ErrDeviceTensor, k.Device, v.Device)
	case k.Len != v.Len || k.Len <= 0 || k.Len%s.tok != 0:
		return fmt.Errorf("append seq %d layer %d: %w: k and v hold %d and %d floats, want equal positive multiples of KVHeads*HeadDim = %d",
			id, layer, ErrBadShape, k.Len, v.Len, s.tok)
	}
	return s.appendN(id, layer, k.Len/s.tok, func(pages []int32, slot int) error {
		return td.WriteTensor(layer, pages, slot, k, v)
	})
}

// appendN is Append of n checked tokens, which write stores into pages
// from slot on.
func (s *Store) appendN(id SeqID, layer, n int, write func(pages []int32, slot int) error) error {
	sq, err := s.lock(id)
	if err != nil {
		return fmt.Errorf("append seq %d layer %d: %w", id, layer, err)
	}
	// The table changed when this call took pages (fresh, cow are its
	// scratch from phase 1 on; before, a previous call's: a spare check).
	defer func() { s.unlock(sq, len(sq.fresh) > 0 || len(sq.cow) > 0) }()

	S := s.cfg.PageSize
	pos := sq.lens[layer]
	end := pos + n
	first, last := pos/S, (end-1)/S
	if last >= s.cfg.Capacity {
		return fmt.Errorf("append seq %d layer %d: %d tokens at position %d need %d pages, pool holds %d: %w",
			id, layer, n, pos, last+1, s.cfg.Capacity, ErrPoolExhausted)
	}
	needNew := max(0, last+1-len(sq.pages))
	lastOld := min(last, len(sq.pages)-1)
	if s.res != nil {
		if err := s.res.checkRoom(sq.pages[first:lastOld+1], needNew); err != nil {
			return fmt.Errorf("append seq %d layer %d: %w", id, layer, err)
		}
	}

	// Phase 1 (pool lock): find shared pages to copy, check capacity, take
	// pages. Nothing is mutated before the capacity check passes.
	sq.cow = sq.cow[:0]
	s.poolMu.Lock()
	for i := first; i <= lastOld; i++ {
		if s.ref[sq.pages[i]] > 1 {
			sq.cow = append(sq.cow, cowPage{idx: i, old: sq.pages[i]})
		}
	}
	if need := needNew + len(sq.cow); need > len(s.free) {
		free := len(s.free)
		s.poolMu.Unlock()
		return fmt.Errorf("append seq %d layer %d: %d tokens need %d new pages (%d copy-on-write), %d free: %w",
			id, layer, n, need, len(sq.cow), free, ErrPoolExhausted)
	}
	for i := range sq.cow {
		sq.cow[i].new = s.popLocked()
	}
	sq.fresh = sq.fresh[:0]
	for range needNew {
		sq.fresh = append(sq.fresh, s.popLocked())
	}
	s.poolMu.Unlock()

	// Phase 2: fresh summaries for new pages, copies of shared pages (the
	// old page is still referenced by us, so no sibling writes it in place).
	// A failure gives the taken pages back: nothing has changed.
	if err := s.prepare(sq); err != nil {
		s.poolMu.Lock()
		for _, c := range sq.cow {
			s.unrefLocked(c.new)
		}
		for _, p := range sq.fresh {
			s.unrefLocked(p)
		}
		s.poolMu.Unlock()
		return fmt.Errorf("append seq %d layer %d: %w: %w", id, layer, ErrData, err)
	}
	sq.pages = append(sq.pages, sq.fresh...)
	if len(sq.cow) > 0 {
		s.poolMu.Lock()
		for _, c := range sq.cow {
			sq.pages[c.idx] = c.new
			s.unrefLocked(c.old)
		}
		s.poolMu.Unlock()
	}

	// Phase 3: tell the data about the new table entries, write K/V and
	// widen summaries. A failure gives the new pages back; the copies made
	// above keep the same contents as the pages they replaced, but the
	// tail page's summary may have been widened.
	err = nil
	if needNew > 0 || len(sq.cow) > 0 {
		err = s.data.Table(id, first, sq.pages[first:], len(sq.pages))
	}
	if err == nil {
		err = write(sq.pages[first:last+1], pos%S)
	}
	if err != nil {
		keep := len(sq.pages) - needNew
		s.poolMu.Lock()
		for _, p := range sq.pages[keep:] {
			s.unrefLocked(p)
		}
		s.poolMu.Unlock()
		sq.pages = sq.pages[:keep]
		if needNew > 0 || len(sq.cow) > 0 {
			// Best effort (the data failed already, perhaps reporting
			// this very table): the data's table must name the copies
			// and drop the pages given back.
			at := min(first, keep)
			_ = s.data.Table(id, at, sq.pages[at:], keep)
		}
		s.setPins(sq, sq.pages)
		return fmt.Errorf("append seq %d layer %d: %w: %w", id, layer, ErrData, err)
	}
	sq.lens[layer] = end
	if needNew > 0 || len(sq.cow) > 0 {
		s.setPins(sq, sq.pages)
	}
	if s.pers != nil {
		s.noteLayerLen(id, sq, layer)
		if minLen(sq.lens)/S > sq.sealedUpTo || sq.unsaved {
			if err := s.persistSeq(id, sq); err != nil {
				return fmt.Errorf("append seq %d layer %d: %w", id, layer, err)
			}
		}
	}
	return nil
}

// prepare resets the summaries of the pages an append takes and copies the
// shared pages it writes (sq locked).
func (s *Store) prepare(sq *seq) error {
	if len(sq.fresh) > 0 {
		if err := s.data.Reset(sq.fresh); err != nil {
			return err
		}
	}
	for _, c := range sq.cow {
		if err := s.copyPage(sq, c.new, c.old, c.idx); err != nil {
			return err
		}
	}
	return nil
}

// copyPage copies logical page idx of sq (physical src) to physical page
// dst: the valid slots of every layer and the summaries.
func (s *Store) copyPage(sq *seq, dst, src int32, idx int) error {
	S := s.cfg.PageSize
	sq.valid = sq.valid[:0]
	for _, n := range sq.lens {
		sq.valid = append(sq.valid, min(max(n-idx*S, 0), S))
	}
	return s.data.Copy(dst, src, sq.valid)
}

func (s *Store) popLocked() int32 {
	p := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.ref[p] = 1
	return p
}

func (s *Store) unrefLocked(p int32) {
	s.ref[p]--
	if s.ref[p] == 0 {
		s.free = append(s.free, p)
		if s.res != nil {
			s.res.drop(p)
		}
		if s.pers != nil {
			s.pers.dropPage(p)
		}
	}
}

// setPins makes sq pin the pages of table that its windows cover (the
// first PinFirst and last PinLast entries) and nothing else (sq locked;
// a no-op without offload). Call it before pages sq pins are freed.
func (s *Store) setPins(sq *seq, table []int32) {
	if s.res == nil {
		return
	}
	n := len(table)
	first := min(s.cfg.PinFirst, n)
	from := max(n-s.cfg.pinLast(), first)
	sq.pinBuf = append(append(sq.pinBuf[:0], table[:first]...), table[from:]...)
	r := s.res
	r.mu.Lock()
	for _, p := range sq.pinBuf {
		r.pin(p)
	}
	for _, p := range sq.pinned {
		r.unpin(p)
	}
	r.mu.Unlock()
	sq.pinned, sq.pinBuf = sq.pinBuf, sq.pinned
}

// Fork creates a child sequence that shares every page of parent (the
// partially filled tail page included) and returns its id. Later writes in
// either branch copy a shared page first. All layers of parent must have the
// same length.
func (s *Store) Fork(parent SeqID) (SeqID, error) {
	sq, err := s.lock(parent)
	if err != nil {
		return 0, fmt.Errorf("fork seq %d: %w", parent, err)
	}
	defer s.unlock(sq, true)
	if err := s.checkEven(sq); err != nil {
		return 0, fmt.Errorf("fork seq %d: %w", parent, err)
	}
	child := &seq{
		pages:      append([]int32(nil), sq.pages...),
		lens:       append([]int(nil), sq.lens...),
		sealedUpTo: sq.sealedUpTo,
	}
	s.seqMu.Lock()
	id := s.nextID
	s.nextID++
	s.seqMu.Unlock()
	if err := s.data.Table(id, 0, child.pages, len(child.pages)); err != nil {
		_ = s.data.Drop(id)
		return 0, fmt.Errorf("fork seq %d: %w: %w", parent, ErrData, err)
	}
	s.poolMu.Lock()
	for _, p := range sq.pages {
		s.ref[p]++
	}
	s.poolMu.Unlock()
	s.setPins(child, child.pages)
	var perr error
	if s.pers != nil {
		s.newLenRec(child)
		s.noteLen(id, child)
		if err := s.persistSeq(id, child); err != nil {
			perr = fmt.Errorf("fork seq %d: child %d: %w", parent, id, err)
		}
	}
	s.seqMu.Lock()
	s.seqs[id] = child
	s.seqMu.Unlock()
	return id, perr
}

// ForkPrefix creates a child sequence holding the first tokens tokens of
// parent (0 <= tokens <= Len; all layers of parent at the same length):
// the child shares parent's pages that the prefix covers in full (sealed
// pages and their summaries: refcount+1, persisted by a persisting
// store), and gets its own copy of a partially covered last page, whose
// summaries are rescanned from the prefix's keys. It is Fork followed by
// Rollback of the child: each branch keeps its own selection, and writes
// in either branch never change the other. On a failure no child is left
// behind, except for an error wrapping ErrPersist (the child exists in
// memory; its id is returned).
func (s *Store) ForkPrefix(parent SeqID, tokens int) (SeqID, error) {
	n, err := s.Len(parent)
	if err != nil {
		return 0, fmt.Errorf("fork prefix of seq %d: %w", parent, err)
	}
	if tokens < 0 || tokens > n {
		return 0, fmt.Errorf("fork prefix of seq %d: %w: %d tokens, sequence has %d", parent, ErrOutOfRange, tokens, n)
	}
	id, err := s.Fork(parent)
	if err != nil {
		if errors.Is(err, ErrPersist) && id != 0 && tokens == n {
			return id, err
		}
		if id != 0 {
			_ = s.Release(id)
		}
		return 0, fmt.Errorf("fork prefix of seq %d: %w", parent, err)
	}
	if tokens < n {
		if err := s.Rollback(id, n-tokens); err != nil {
			if errors.Is(err, ErrPersist) {
				return id, fmt.Errorf("fork prefix of seq %d: %w", parent, err)
			}
			_ = s.Release(id)
			return 0, fmt.Errorf("fork prefix of seq %d at %d tokens: %w", parent, tokens, err)
		}
	}
	return id, nil
}

func (s *Store) checkEven(sq *seq) error {
	for l, n := range sq.lens {
		if n != sq.lens[0] {
			return fmt.Errorf("%w: layer 0 has %d tokens, layer %d has %d", ErrUnevenLayers, sq.lens[0], l, n)
		}
	}
	return nil
}

// CheckAppend reports, changing nothing, whether appending n tokens to
// layer of sequence id would fit: it returns the free pages the append would
// take (new pages plus copy-on-write copies of shared pages it writes), or
// an error wrapping ErrPoolExhausted, ErrUnknownSequence,
// ErrLayerOutOfRange or ErrOutOfRange. Callers that append to several
// stores at once (a sharded engine) check them all first.
func (s *Store) CheckAppend(id SeqID, layer, n int) (int, error) {
	if err := s.checkLayer(layer); err != nil {
		return 0, fmt.Errorf("check append seq %d layer %d: %w", id, layer, err)
	}
	if n < 1 {
		return 0, fmt.Errorf("check append seq %d layer %d: %w: %d tokens", id, layer, ErrOutOfRange, n)
	}
	sq, err := s.lock(id)
	if err != nil {
		return 0, fmt.Errorf("check append seq %d layer %d: %w", id, layer, err)
	}
	defer sq.mu.Unlock()
	S := s.cfg.PageSize
	pos := sq.lens[layer]
	first, last := pos/S, (pos+n-1)/S
	if last >= s.cfg.Capacity {
		return 0, fmt.Errorf("check append seq %d layer %d: %d pages needed, pool holds %d: %w", id, layer, last+1, s.cfg.Capacity, ErrPoolExhausted)
	}
	need := max(0, last+1-len(sq.pages))
	if s.res != nil {
		if err := s.res.checkRoom(sq.pages[first:min(last, len(sq.pages)-1)+1], need); err != nil {
			return 0, fmt.Errorf("check append seq %d layer %d: %w", id, layer, err)
		}
	}
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	for i := first; i <= min(last, len(sq.pages)-1); i++ {
		if s.ref[sq.pages[i]] > 1 {
			need++
		}
	}
	if need > len(s.free) {
		return need, fmt.Errorf("check append seq %d layer %d: %d pages needed, %d free: %w", id, layer, need, len(s.free), ErrPoolExhausted)
	}
	return need, nil
}
