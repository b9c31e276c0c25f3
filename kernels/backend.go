package kernels

import (
	"context"
	"errors"
	"fmt"

	"github.com/questrt/questrt/plan"
)

// GQAMode says how the query heads of one KV head group share page
// selection; it is defined with the policy in package plan.
type GQAMode = plan.GQAMode

// The GQA modes (see plan.GroupMax and plan.PerHead).
const (
	GroupMax = plan.GroupMax
	PerHead  = plan.PerHead
)

// Shape is the head geometry of one shard's layer.
type Shape struct {
	QHeads   int // query heads served by this shard
	KVHeads  int // KV heads stored by this shard; QHeads % KVHeads == 0
	HeadDim  int // D
	PageSize int // S, tokens per page
}

// Validate reports whether the shape is usable.
func (s Shape) Validate() error {
	switch {
	case s.QHeads <= 0, s.KVHeads <= 0, s.HeadDim <= 0, s.PageSize <= 0:
		return fmt.Errorf("shape %+v: every size must be positive", s)
	case s.QHeads%s.KVHeads != 0:
		return fmt.Errorf("shape %+v: query heads must be a multiple of KV heads", s)
	}
	return nil
}

// Group is the number of query heads per KV head.
func (s Shape) Group() int { return s.QHeads / s.KVHeads }

// Rows is the number of score/selection rows per sequence for mode.
func (s Shape) Rows(m GQAMode) int {
	if m == PerHead {
		return s.QHeads
	}
	return s.KVHeads
}

// Layer is the page pool of one layer, read in place. K and V are
// [pages][KVHeads][PageSize][HeadDim]; Summary is [pages][KVHeads][2][HeadDim]
// (mins then maxes), indexed by physical page id.
type Layer struct {
	K, V, Summary []float32
	// SubBoxes > 1 (plan.Policy.SubBoxes) makes Score rank each page by
	// Sub, [pages][KVHeads][SubBoxes][2][HeadDim]: a page's bound is the
	// largest over its non-empty sub-boxes (an empty one, +Inf minimum
	// over -Inf maximum, holds no valid key and is skipped; a page with
	// a valid token has a non-empty first sub-box). Summary stays the
	// page box. 0 or 1: Score reads Summary. Only the CPU backend
	// scores sub-boxes; the others refuse them (ErrSubBoxes).
	SubBoxes int
	Sub      []float32
	// K8 and V8, when set, hold K and V as fp8 records (plan.FP8, see
	// kernels/fp8 "KV records") instead of K and V, which are then nil:
	// E4M3fn codes in the layout of K and V, and KScale and VScale the
	// records' scales, [pages][KVHeads]; element = fp8.Value(code) *
	// scale. Summary stays float32, taken over the dequantized keys.
	K8, V8         []uint8
	KScale, VScale []float32
	// Device, when set, is the same pool resident in a backend's device
	// memory (for the CUDA backend a *cuda.DeviceLayer); the host arrays
	// may then be nil. A backend that gets no Device uploads the host
	// arrays for the call.
	Device any
	// Slots, with a slot pool as Device (SlotStore.NewSlotPool), makes
	// the kernels address the pool's K/V by physical page through a
	// device page -> slot table (SlotTables): the batch lists physical
	// pages for attention as it does for scoring, and page p's K/V are
	// read from the slot the table gives it, so a step over pages that
	// are all resident runs like one over a pool holding every page.
	// Nil: a slot pool is attended by slot (the batch's pages are slots).
	Slots *SlotUse
}

// SlotUse names a device page -> slot table (SlotTables.NewSlotTable)
// for a call on a slot pool (Layer.Slots), and the tick a Stepper stamps
// into the table's use entry of every page a row attends: the recency of
// the selected pages, kept on the device and read back only when the
// host needs it (SlotTables.ReadSlotTable).
type SlotUse struct {
	Table any
	Tick  uint64
}

// FP8 reports whether the layer holds fp8 K/V records (K8 set).
func (l Layer) FP8() bool { return l.K8 != nil }

// Batch describes the sequences of one step in CSR form. Sequence b owns the
// physical pages Pages[Indptr[b]:Indptr[b+1]] in logical order; its last page
// holds LastLen[b] valid tokens (1..PageSize). A sequence with no pages is
// allowed (its LastLen is ignored) and contributes empty states.
//
// Tables, when set, says that the sequences' page tables live in the
// backend's device memory (see DeviceStore.WriteTable): Pages is then nil
// and the kernels read the first NumPages(b) entries of each sequence's
// device table instead.
type Batch struct {
	Indptr  []int32
	Pages   []int32
	LastLen []int32
	Tables  *DeviceTables
}

// DeviceTables names page tables kept in a backend's device memory: Set is
// a table set of the backend's (DeviceStore.NewTables) and Seqs the batch's
// sequences in order, as keys of the set.
type DeviceTables struct {
	Set  any
	Seqs []uint64
}

// Len is the number of sequences in the batch.
func (b *Batch) Len() int { return len(b.Indptr) - 1 }

// Total is the number of pages of all sequences (Indptr's last entry).
func (b *Batch) Total() int { return int(b.Indptr[len(b.Indptr)-1]) }

// MaxPages is the page count of the longest sequence.
func (b *Batch) MaxPages() int {
	m := 0
	for i := range b.Len() {
		m = max(m, b.NumPages(i))
	}
	return m
}

// checkIndptr reports an indptr that does not start at 0 or decreases.
func (b *Batch) checkIndptr() error {
	if len(b.Indptr) < 1 || b.Indptr[0] != 0 {
		return errors.New("batch: indptr must start at 0")
	}
	for i := range b.Len() {
		if b.Indptr[i+1] < b.Indptr[i] {
			return fmt.Errorf("batch: indptr decreases at %d", i)
		}
	}
	return nil
}

// NumPages is the page count of sequence i.
func (b *Batch) NumPages(i int) int { return int(b.Indptr[i+1] - b.Indptr[i]) }

// ErrDeviceTables is returned by kernels that read page tables on the host
// when a batch's tables live on a device (Batch.Tables).
var ErrDeviceTables = errors.New("batch: the page tables live in device memory; this kernel reads them on the host")

// Validate checks the CSR arrays against the shape and the layer's pool
// size (K, V and summaries); the batch must carry host page tables.
func (b *Batch) Validate(s Shape, l Layer) error {
	if b.Tables != nil {
		return ErrDeviceTables
	}
	pool := len(l.Summary) / (s.KVHeads * 2 * s.HeadDim)
	if l.FP8() {
		if len(l.K8) != pool*s.KVHeads*s.PageSize*s.HeadDim || len(l.V8) != len(l.K8) ||
			len(l.KScale) != pool*s.KVHeads || len(l.VScale) != len(l.KScale) || l.K != nil || l.V != nil {
			return fmt.Errorf("batch: fp8 layer arrays K8=%d V8=%d codes, scales %d and %d, summary=%d floats (and float32 K=%d V=%d) do not match one pool",
				len(l.K8), len(l.V8), len(l.KScale), len(l.VScale), len(l.Summary), len(l.K), len(l.V))
		}
	} else if len(l.K) != pool*s.KVHeads*s.PageSize*s.HeadDim || len(l.V) != len(l.K) {
		return fmt.Errorf("batch: layer arrays K=%d V=%d summary=%d floats do not match one pool", len(l.K), len(l.V), len(l.Summary))
	}
	return b.ValidateSummaries(s, l)
}

// ValidateSummaries is Validate for kernels that read only the summaries
// (Score): K and V may be absent.
func (b *Batch) ValidateSummaries(s Shape, l Layer) error {
	if b.Tables != nil {
		return ErrDeviceTables
	}
	rec := s.KVHeads * 2 * s.HeadDim
	if len(l.Summary)%rec != 0 {
		return fmt.Errorf("batch: summary pool of %d floats is not a whole number of %d-float pages", len(l.Summary), rec)
	}
	if l.SubBoxes > 1 && len(l.Sub) != len(l.Summary)*l.SubBoxes {
		return fmt.Errorf("batch: sub-box pool of %d floats for %d sub-boxes of a %d-float summary pool (want %d)", len(l.Sub), l.SubBoxes, len(l.Summary), len(l.Summary)*l.SubBoxes)
	}
	return b.ValidatePool(s, len(l.Summary)/rec)
}

// ValidatePool checks the CSR arrays against the shape and a pool of pool
// physical pages (a device layer's size, say).
func (b *Batch) ValidatePool(s Shape, pool int) error {
	if len(b.Indptr) < 1 || b.Indptr[0] != 0 {
		return errors.New("batch: indptr must start at 0")
	}
	n := b.Len()
	if len(b.LastLen) != n {
		return fmt.Errorf("batch: %d last lengths for %d sequences", len(b.LastLen), n)
	}
	for i := 0; i < n; i++ {
		if b.Indptr[i+1] < b.Indptr[i] {
			return fmt.Errorf("batch: indptr decreases at %d", i)
		}
		if b.NumPages(i) > 0 && (b.LastLen[i] < 1 || int(b.LastLen[i]) > s.PageSize) {
			return fmt.Errorf("batch: sequence %d last page length %d outside 1..%d", i, b.LastLen[i], s.PageSize)
		}
	}
	if b.Tables != nil {
		// The tables are the store's own, written through WriteTable:
		// their entries were checked when they were written.
		if b.Pages != nil || len(b.Tables.Seqs) != n {
			return fmt.Errorf("batch: device tables for %d sequences (and %d host pages) in a batch of %d", len(b.Tables.Seqs), len(b.Pages), n)
		}
		return nil
	}
	if int(b.Indptr[n]) != len(b.Pages) {
		return fmt.Errorf("batch: indptr ends at %d but %d pages given", b.Indptr[n], len(b.Pages))
	}
	for i, p := range b.Pages {
		if p < 0 || int(p) >= pool {
			return fmt.Errorf("batch: physical page %d at %d outside pool of %d", p, i, pool)
		}
	}
	return nil
}

// ScoreOffset is where sequence i's scores start in a Score output: the
// output holds, per sequence, rows x NumPages(i) floats, row-major.
func (b *Batch) ScoreOffset(i, rows int) int { return int(b.Indptr[i]) * rows }

// TopKPlan lists top-K rows in CSR-like arrays (one entry per row). Row r
// selects K[r] of the N[r] candidate scores starting at scores[ScoreOff[r]];
// candidate i is logical page Base[r]+i. The chosen logical pages are written
// in ascending order to out[OutOff[r]:OutOff[r]+min(K[r],N[r])], or, when
// BestFirst is set, in either that order or best first.
type TopKPlan struct {
	ScoreOff []int32
	N        []int32
	Base     []int32
	K        []int32
	OutOff   []int32
	// BestFirst says that the caller takes each row's pages best first
	// as well as ascending: a backend may then write them in plan.Compare's
	// order (score descending, ties to the lower page; -0 ties with +0),
	// what the exact selection's exchange sends (package collective sorts
	// a row that does not come in that order). The set written is the
	// same either way. The CPU backend writes best first; the CUDA
	// backend writes ascending.
	BestFirst bool
}

// Rows is the number of rows in the plan.
func (p *TopKPlan) Rows() int { return len(p.N) }

// Reset empties the plan, keeping its storage, and clears BestFirst.
func (p *TopKPlan) Reset() {
	p.ScoreOff, p.N, p.Base, p.K, p.OutOff = p.ScoreOff[:0], p.N[:0], p.Base[:0], p.K[:0], p.OutOff[:0]
	p.BestFirst = false
}

// Add appends a row.
func (p *TopKPlan) Add(scoreOff, n, base, k, outOff int) {
	p.ScoreOff = append(p.ScoreOff, int32(scoreOff))
	p.N = append(p.N, int32(n))
	p.Base = append(p.Base, int32(base))
	p.K = append(p.K, int32(k))
	p.OutOff = append(p.OutOff, int32(outOff))
}

// Check reports plan arrays of different lengths and any row whose
// candidates fall outside nScores scores or whose output falls outside an
// output of nOut entries; it returns the output length the plan writes
// (the largest OutOff[r]+min(K[r], N[r])).
func (p *TopKPlan) Check(nScores, nOut int) (int, error) {
	n := p.Rows()
	if len(p.ScoreOff) != n || len(p.Base) != n || len(p.K) != n || len(p.OutOff) != n {
		return 0, fmt.Errorf("topk: plan arrays have different lengths")
	}
	outLen := 0
	for r := range n {
		so, cnt, k, oo := int(p.ScoreOff[r]), int(p.N[r]), int(p.K[r]), int(p.OutOff[r])
		if so < 0 || cnt < 0 || so+cnt > nScores {
			return 0, fmt.Errorf("topk: row %d candidates [%d,%d) outside %d scores", r, so, so+cnt, nScores)
		}
		if k < 0 || oo < 0 || oo+min(k, cnt) > nOut {
			return 0, fmt.Errorf("topk: row %d output [%d,+%d) outside %d", r, oo, min(k, cnt), nOut)
		}
		outLen = max(outLen, oo+min(k, cnt))
	}
	return outLen, nil
}

// Lists gives, per (sequence, row), the logical pages to attend. Rows follow
// Mode: KV heads for GroupMax (the list serves every query head of the
// group), query heads for PerHead. Row (b, r) is index b*rows+r; its pages
// are Pages[Indptr[i]:Indptr[i+1]], each in [0, NumPages(b)), no duplicates,
// in any order.
type Lists struct {
	Mode   GQAMode
	Indptr []int32
	Pages  []int32
	// All says that every row lists every page of its sequence in
	// logical order (dense attention): Indptr and Pages are then unused
	// and may be nil, so nobody builds, checks or moves them.
	All bool
}

// Check reports, for a batch b with rows rows per sequence, a malformed
// indptr and any row that lists a page twice or a page outside its
// sequence. seen is scratch, grown as needed and returned all false, so a
// caller that keeps it allocates nothing.
func (l *Lists) Check(b *Batch, rows int, seen []bool) ([]bool, error) {
	if l.All {
		return seen, nil // every page once, by construction
	}
	for row := range len(l.Indptr) - 1 {
		lo, hi := l.Indptr[row], l.Indptr[row+1]
		if hi < lo || int(hi) > len(l.Pages) {
			return seen, fmt.Errorf("lists indptr decreases or overruns at row %d", row)
		}
		np := b.NumPages(row / rows)
		if len(seen) < np {
			seen = make([]bool, np)
		}
		var err error
		k := lo
		for ; k < hi; k++ {
			p := l.Pages[k]
			if p < 0 || int(p) >= np {
				err = fmt.Errorf("sequence %d row %d: page %d outside 0..%d", row/rows, row%rows, p, np-1)
				break
			}
			if seen[p] {
				err = fmt.Errorf("sequence %d row %d: page %d listed twice", row/rows, row%rows, p)
				break
			}
			seen[p] = true
		}
		for _, p := range l.Pages[lo:k] {
			seen[p] = false
		}
		if err != nil {
			return seen, err
		}
	}
	return seen, nil
}

// Backend runs the Quest kernels. Implementations are safe for concurrent
// use; calls may serialize. Output slices are caller-owned; a backend keeps
// no reference to them after a call returns.
type Backend interface {
	// Name is "cpu" or "cuda".
	Name() string
	// Score writes U for every page of every sequence of b for every row
	// of mode: out[b.ScoreOffset(i, rows) + r*NumPages(i) + p]. q is
	// [sequences][QHeads][HeadDim]. It reads only l.Summary (K and V may
	// be nil).
	Score(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, mode GQAMode, out []float32) error
	// TopK runs every row of plan over scores (see TopKPlan).
	TopK(ctx context.Context, scores []float32, plan *TopKPlan, out []int32) error
	// Attend computes attention of every query head over its row's pages,
	// reading K/V in place, and writes partial states: o is
	// [sequences][QHeads][HeadDim], lse is [sequences][QHeads].
	Attend(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, lists *Lists, o, lse []float32) error
	// Merge folds the partial states (o2, lse2) into (o, lse), element by
	// state; both are [n][dim] and [n].
	Merge(ctx context.Context, dim int, o, lse, o2, lse2 []float32) error
	// Close releases the backend's workers and memory.
	Close() error
}

// DeviceStore is implemented by backends whose kernels read page pools from
// their own device memory (the CUDA backend). A shard whose pages live on
// the device allocates one pool per layer and makes every change of page
// contents through these methods (the host keeps only the metadata); it
// passes the pool to the kernels as Layer.Device. Page ids are physical
// ids of the pool. Writes may be queued: a failure can surface at a later
// call. Methods are safe for concurrent use.
type DeviceStore interface {
	// NewPool allocates a device pool of pages pages for one layer.
	NewPool(ctx context.Context, pages, kvHeads, headDim, pageSize int) (any, error)
	// FreePool releases a pool.
	FreePool(ctx context.Context, pool any) error
	// WriteTokens stores the tokens k, v ([n][KVHeads][HeadDim], float32)
	// into slots slot, slot+1, ... of pages[0], continuing in pages[1],
	// ..., and widens those pages' summaries with the stored keys; the
	// token written to slot 0 of a page starts its summary afresh.
	WriteTokens(ctx context.Context, pool any, pages []int32, slot int, k, v []float32) error
	// Rescan recomputes the summaries of pages from their first valid
	// stored keys (valid = 0 gives the empty box: +Inf minima, -Inf
	// maxima).
	Rescan(ctx context.Context, pool any, pages []int32, valid int) error
	// CopyPage copies page src (K, V and summaries) to page dst.
	CopyPage(ctx context.Context, pool any, dst, src int32) error
	// NewTables makes an empty set of device page tables (one per
	// sequence, keyed by the caller's ids); FreeTables releases a set.
	NewTables(ctx context.Context) (any, error)
	FreeTables(ctx context.Context, set any) error
	// WriteTable sets entries [at, at+len(pages)) of sequence seq's table
	// in set to pages and its length to n >= at+len(pages) (a sequence
	// not in the set starts empty; at may not exceed the current length
	// and n may exceed neither it nor at+len(pages), so no entry is left
	// unwritten). Entries are physical ids below
	// maxPage, the size of the pools the set's tables index.
	WriteTable(ctx context.Context, set any, seq uint64, at int, pages []int32, n, maxPage int) error
	// DropTable forgets sequence seq's table.
	DropTable(ctx context.Context, set any, seq uint64) error
	// ReadPages returns float32 copies of pages: page i of the result
	// (in the Layer layout, K and V [len(pages)][KVHeads][PageSize]
	// [HeadDim], summaries [len(pages)][KVHeads][2][HeadDim]) is
	// pages[i]. For diagnostics and tests, not the hot path.
	ReadPages(ctx context.Context, pool any, pages []int32) (Layer, error)
}

// ErrSubBoxes is returned by backends that do not score multi-box
// summaries (Layer.SubBoxes > 1): every backend but the CPU one.
var ErrSubBoxes = errors.New("kernels: multi-box summaries (sub-boxes) are scored by the CPU backend only")

// ErrClosed is returned by calls on a closed backend.
var ErrClosed = errors.New("kernels: backend closed")

// ErrUnsupportedDType is returned by a backend asked to store or read a
// storage type it does not implement (the CUDA backend's slot pools, GPU
// prefill and kernel benchmark and plan.FP8 K/V, for now).
var ErrUnsupportedDType = errors.New("kernels: storage type not supported by this backend")

// SlotMove names one page payload move of an offloading device store:
// tier page Page to or from device slot Slot.
type SlotMove struct{ Page, Slot int32 }

// SlotStore is implemented by device stores that can keep a pool's K/V in
// fewer device slots than the pool has pages (offload to a host tier):
// summaries stay on the device for every physical page, K/V live in
// device slots, and page payloads move between the slots and a host tier
// the device reads and writes directly. A slot pool passed as
// Layer.Device is scored by physical page and attended by slot (the
// batch's Pages are then slots). Calls are queued in order with the
// kernels; HostTier reads and writes on the host wait for the moves queued
// before them.
type SlotStore interface {
	DeviceStore
	// PoolDType is the storage type of the pools' K, V and summaries
	// (the tier's payload element type).
	PoolDType() plan.DType
	// NewSlotPool allocates a pool with summaries for pages pages and K/V
	// for slots slots.
	NewSlotPool(ctx context.Context, pages, slots, kvHeads, headDim, pageSize int) (any, error)
	// WriteSlotTokens is DeviceStore.WriteTokens for a slot pool: page
	// pages[i] has its K/V in slot slots[i].
	WriteSlotTokens(ctx context.Context, pool any, pages, slots []int32, slot int, k, v []float32) error
	// RescanSlot recomputes page's summaries from the first valid keys
	// stored in slot.
	RescanSlot(ctx context.Context, pool any, page, slot int32, valid int) error
	// CopySlot copies the K/V of slot srcSlot to slot dstSlot and the
	// summaries of page src to page dst.
	CopySlot(ctx context.Context, pool any, dst, src, dstSlot, srcSlot int32) error
	// NewHostTier allocates a host tier of pages payloads of payload
	// bytes (the pagestore/tier layout: layer-major, K then V, each one
	// slot's block in the pools' storage type) in memory the device maps.
	NewHostTier(ctx context.Context, pages, payload int) (HostTier, error)
	// MoveSlots copies, for every save, slot Slot of every pool (the
	// layers, in order) to the tier's page Page, then for every load the
	// tier's page to the slot. Queued, not waited for.
	MoveSlots(ctx context.Context, pools []any, t HostTier, saves, loads []SlotMove) error
	// ReadSlotKV returns float32 copies of the K and V of slot (each
	// [KVHeads][PageSize][HeadDim]). For diagnostics and tests.
	ReadSlotKV(ctx context.Context, pool any, slot int32) (k, v []float32, err error)
}

// SlotTables is implemented by SlotStores whose kernels can read a slot
// pool's K/V through a page -> slot table in device memory (Layer.Slots):
// one int32 slot per physical page (-1: not resident) and one use stamp
// per page, both written on the device, in order with the kernels and
// the moves. A page a call attends through the table must have a slot
// (the CUDA kernels read slot 0 for one that has none; the pretend device
// fails the call).
type SlotTables interface {
	// NewSlotTable makes a table of pages pages, every page without a
	// slot and every use stamp 0.
	NewSlotTable(ctx context.Context, pages int) (any, error)
	// FreeSlotTable releases a table.
	FreeSlotTable(ctx context.Context, table any) error
	// WriteSlotTable sets the slot of page pages[i] to slots[i] (-1:
	// none), in order: a page listed more than once gets its last
	// entry. Queued, not waited for.
	WriteSlotTable(ctx context.Context, table any, pages, slots []int32) error
	// ReadSlotTable waits for the queued work and returns copies of the
	// table's slots and use stamps (one of each per page).
	ReadSlotTable(ctx context.Context, table any) (slots []int32, uses []uint64, err error)
}

// CheckSlotUse validates a call's Layer.Slots: only on a slot pool, with
// a table.
func CheckSlotUse(l Layer, slotPool bool) error {
	if l.Slots == nil {
		return nil
	}
	if !slotPool {
		return errors.New("kernels: Layer.Slots (a page -> slot table) on a pool that is not a slot pool")
	}
	if l.Slots.Table == nil {
		return errors.New("kernels: Layer.Slots without a table")
	}
	return nil
}

// HostTier is a page tier in host memory that a SlotStore's device maps:
// the method set of pagestore/tier.Tier, whose contract it keeps (Read of
// a page never written fails with tier.ErrEmpty; moves to the tier count
// as writes).
type HostTier interface {
	Slots() int
	PayloadBytes() int
	Write(ctx context.Context, slot int, payload []byte) error
	Read(ctx context.Context, slot int, dst []byte) error
	Free(ctx context.Context, slot int) error
	Close() error
}
