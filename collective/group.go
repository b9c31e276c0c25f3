package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// ErrDuplicatePage: the same page index reached a global top-K twice (two
// ranks proposed it, or one rank proposed it twice). Every rank sees the
// same candidates, so every rank reports it.
var ErrDuplicatePage = errors.New("collective: duplicate page in selection")

// abortTimeout bounds the best-effort aborts a failing member sends to its
// peers; they use a context detached from the caller's, which may already
// be done.
const abortTimeout = 50 * time.Millisecond

// Candidate is one page proposed for a row's top-K (its score and global
// page index): the wire type of the selection exchange, defined with the
// merge rule it follows (plan.Compare, plan.MergeTopK) in package plan.
type Candidate = plan.Candidate

// Group runs the group operations of one member over a Transport. It keeps
// scratch buffers between calls, so after warm-up an operation allocates
// only the messages the transport hands it (and Select's result rows when
// dst is too small). A Group is not safe for concurrent use: goroutines
// that run operations concurrently over one transport (pipelined layers,
// say) use a Group each, with distinct tags.
//
// Every operation is collective: all members call it with the same tag
// (and root, shapes, budgets). Failure semantics: an operation returns an
// error and no partial result (outputs are written only on success). A
// member whose call fails sends an abort under the tag to every peer that
// may still be waiting for a message from it, so those peers fail promptly
// with ErrAborted instead of waiting for their deadline; a member that
// blocks (a hung peer) is detected only by the others' ctx deadlines. There
// is no commit round: a member that already has everything it needs from a
// failed peer may still succeed. After a failure, the tag must not be
// reused (messages can remain buffered under it).
type Group struct {
	tr         Transport
	rank, size int

	buf      []byte     // outgoing frame
	recv     [][]byte   // per rank: received frame (own: buf)
	sent     []bool     // per rank: data sent this operation
	all      []uint64   // this member's sort keys when its frame cannot hold them (keysView)
	copyKeys bool       // tests: copy every frame's keys, as on a big-endian machine
	keys     [][]uint64 // per rank: its candidates' sort keys, rows one after another (a view of its frame, or a copy)
	scr      [][]uint64 // per rank: where its keys are copied when its frame cannot be viewed
	rowAt    []int      // [row*size+rank]: where that rank's row starts in keys[rank]
	cnt      []int      // [row*size+rank]: that rank's number of candidates of the row
	plo      []uint32   // [row*size+rank]: the smallest page among them
	phi      []uint32   // [row*size+rank]: the largest
	sorter   keySorter
	in       []uint64 // this member's keys of one row, before the sort
	kh       uint64   // hashBudgets of this operation's budgets
	ownDup   bool     // this member's own input has a candidate twice
	pos      []int    // per rank: its candidates taken into the row being merged
	bits     []uint64 // page bitmap of the row being merged; all zero between rows
	flat     []int32  // the row's pages out of bits, with slack (emitBitmap)
	stamp    []uint32 // per page of a row's range: the row (gen) that took it (emitAny)
	gen      uint32   // emitAny's row count, never 0 in stamp's use
	acc      []float32
	tmp      []float32
}

// NewGroup returns the member of the group reachable through tr.
func NewGroup(tr Transport) *Group {
	n := tr.Size()
	return &Group{
		tr: tr, rank: tr.Rank(), size: n,
		recv: make([][]byte, n),
		keys: make([][]uint64, n),
		scr:  make([][]uint64, n),
		sent: make([]bool, n),
		pos:  make([]int, n),
	}
}

// Transport returns the group's transport.
func (g *Group) Transport() Transport { return g.tr }

// Rank returns this member's rank.
func (g *Group) Rank() int { return g.rank }

// Size returns the number of members.
func (g *Group) Size() int { return g.size }

// Abort tells every peer of tr that this member gives up the operation
// under tag, so their pending or future call under it fails with
// ErrAborted (wrapped in a RankError naming this rank). An engine calls it
// when it fails between operations, e.g. a rank whose attention failed
// aborts the merge its peers are about to wait in. It is best-effort and
// returns the first send error.
func Abort(ctx context.Context, tr Transport, tag uint64, cause error) error {
	var first error
	msg := abortFrame(0, cause)
	for r := range tr.Size() {
		if r == tr.Rank() {
			continue
		}
		if err := tr.Send(ctx, r, tag, msg); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// AbortRank is Abort for one peer: it tells rank to that this member gives
// up the operation under tag (for operations where only that peer waits on
// this member, such as a Reduce's root).
func AbortRank(ctx context.Context, tr Transport, tag uint64, to int, cause error) error {
	if err := checkRank(to, tr.Size()); err != nil {
		return err
	}
	if to == tr.Rank() {
		return nil
	}
	return tr.Send(ctx, to, tag, abortFrame(0, cause))
}

func abortFrame(op Op, cause error) []byte {
	reason := "unknown"
	if cause != nil {
		reason = cause.Error()
	}
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	b := make([]byte, headerLen+len(reason))
	putHeader(b, kindAbort, op)
	copy(b[headerLen:], reason)
	return b
}

// abortPeers sends an abort to each peer r != rank with want(r).
func (g *Group) abortPeers(ctx context.Context, tag uint64, op Op, cause error, want func(r int) bool) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	msg := abortFrame(op, cause)
	for r := range g.size {
		if r != g.rank && want(r) {
			_ = g.tr.Send(actx, r, tag, msg) // best effort
		}
	}
}

func (g *Group) abortAll(ctx context.Context, tag uint64, op Op, cause error) {
	g.abortPeers(ctx, tag, op, cause, func(int) bool { return true })
}

func (g *Group) abortUnsent(ctx context.Context, tag uint64, op Op, cause error) {
	g.abortPeers(ctx, tag, op, cause, func(r int) bool { return !g.sent[r] })
}

// sendTo sends g.buf to rank r.
func (g *Group) sendTo(ctx context.Context, r int, tag uint64) error {
	if err := g.tr.Send(ctx, r, tag, g.buf); err != nil {
		return &RankError{Rank: r, Err: err}
	}
	g.sent[r] = true
	return nil
}

// recvFrom receives rank r's frame of op under tag and checks its header.
func (g *Group) recvFrom(ctx context.Context, r int, tag uint64, op Op) ([]byte, error) {
	msg, err := g.tr.Recv(ctx, r, tag)
	if err != nil {
		return nil, &RankError{Rank: r, Err: err}
	}
	if len(msg) < headerLen {
		return nil, &RankError{Rank: r, Err: fmt.Errorf("%w: %d-byte frame", ErrBadMessage, len(msg))}
	}
	if msg[0] == kindAbort {
		return nil, &RankError{Rank: r, Err: fmt.Errorf("%w: %s", ErrAborted, msg[headerLen:])}
	}
	if msg[0] != kindData || msg[2] != version || Op(msg[1]) != op {
		return nil, &RankError{Rank: r, Err: fmt.Errorf("%w: header kind %d op %v version %d, want data %v version %d", ErrBadMessage, msg[0], Op(msg[1]), msg[2], op, version)}
	}
	return msg, nil
}

// exchange sends g.buf to every peer, then receives every peer's frame into
// g.recv (g.recv[rank] = g.buf). Peers are sent to in rotated order (rank+1
// first) so no rank is everyone's first destination. Frames are received
// in rank order; each (nil or not) is called with every rank r, this
// member's own included, as soon as g.recv[r] is set, so a frame's
// decoding overlaps the wait for the next one; its error ends the exchange
// (the later frames stay unreceived under tag).
func (g *Group) exchange(ctx context.Context, tag uint64, op Op, each func(r int) error) error {
	clear(g.sent)
	for i := 1; i < g.size; i++ {
		r := (g.rank + i) % g.size
		if err := g.sendTo(ctx, r, tag); err != nil {
			g.abortUnsent(ctx, tag, op, err)
			return err
		}
	}
	for r := range g.size {
		if r == g.rank {
			g.recv[r] = g.buf
		} else {
			msg, err := g.recvFrom(ctx, r, tag, op)
			if err != nil {
				return err
			}
			g.recv[r] = msg
		}
		if each != nil {
			if err := each(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// AllGather sends msg to every member and returns every member's message,
// indexed by rank; out[Rank()] is msg itself. The other messages are fresh
// buffers the caller owns.
func (g *Group) AllGather(ctx context.Context, tag uint64, msg []byte) ([][]byte, error) {
	g.buf = growBytes(g.buf, headerLen+len(msg))
	putHeader(g.buf, kindData, OpGather)
	copy(g.buf[headerLen:], msg)
	if err := g.exchange(ctx, tag, OpGather, nil); err != nil {
		return nil, fmt.Errorf("allgather tag %#x: %w", tag, err)
	}
	out := make([][]byte, g.size)
	for r := range g.size {
		if r == g.rank {
			out[r] = msg
		} else {
			out[r] = g.recv[r][headerLen:]
		}
		g.recv[r] = nil
	}
	return out, nil
}

// SelectExact derives the global top-k[row] of every row from the members'
// local candidates. local[row] are this member's candidates of the row (at
// most k[row] of them, in any order; the caller has already cut them to its
// local top-k[row]); pages are global logical page indices, unique across
// the group; scores must not be NaN. Every member passes the same rows and
// budgets k.
//
// The result has one ascending page list per row: the first k[row]
// candidates of the union of all members' candidates ordered by Compare
// (score descending, ties to the lower page), fewer when the union is
// smaller. It is identical on every member. Rows are appended into dst's
// storage when its capacity suffices (dst may be nil; its contents are
// unspecified after an error).
//
// Each member sends its candidates to every other member as raw
// little-endian bytes (per row: a count, then an 8-byte sort key per
// candidate, its score's order-preserving bits above its page, sorted by
// Compare): (N-1) * (16 + rows*4 + 8*candidates)
// bytes per member. Each member sorts only its own candidates (no sort
// when they come in Compare order); every row's global top-k is then cut
// from the N sorted lists without sorting them again, and its pages are
// put in ascending order through a bitmap over their range.
func (g *Group) SelectExact(ctx context.Context, tag uint64, local [][]Candidate, k []int, dst [][]int32) ([][]int32, error) {
	out, err := g.selectExact(ctx, tag, local, k, dst, true)
	if err != nil {
		return nil, fmt.Errorf("select tag %#x: %w", tag, err)
	}
	return out, nil
}

// SelectExactUnordered is SelectExact with each row's pages in no
// particular order: the same set of pages per row as SelectExact's, in an
// order that is the same on every member (each rank's taken candidates
// in rank order, best first within a rank, unless the row's pages span
// more than anyPages pages: then ascending). It sends the same frames,
// and differs only in the merge's last pass: the taken pages are written
// as they are cut from the members' lists, and a stamp per page of their
// range only checks that no page comes twice (O(t), no scan of the
// range). For callers that take a row as a set (kernels.Lists, the
// shard's attention and top-p).
func (g *Group) SelectExactUnordered(ctx context.Context, tag uint64, local [][]Candidate, k []int, dst [][]int32) ([][]int32, error) {
	out, err := g.selectExact(ctx, tag, local, k, dst, false)
	if err != nil {
		return nil, fmt.Errorf("select tag %#x: %w", tag, err)
	}
	return out, nil
}

func (g *Group) selectExact(ctx context.Context, tag uint64, local [][]Candidate, k []int, dst [][]int32, ordered bool) ([][]int32, error) {
	rows := len(local)
	if err := g.encodeSelect(local, k); err != nil {
		g.abortAll(ctx, tag, OpSelect, err)
		return nil, err
	}
	defer clear(g.keys) // views of g.recv's frames
	defer clear(g.recv)
	if err := g.exchange(ctx, tag, OpSelect, func(r int) error { return g.parseRank(r, rows, k) }); err != nil {
		return nil, err
	}
	if cap(dst) < rows {
		dst = append(dst[:cap(dst)], make([][]int32, rows-cap(dst))...)
	}
	dst = dst[:rows]
	for row := range rows {
		out, err := g.selectRow(row, k[row], dst[row][:0], ordered)
		if err != nil {
			return nil, err
		}
		dst[row] = out
	}
	return dst, nil
}

// encodeSelect validates this member's input and writes its frame to
// g.buf, its candidates' sort keys sorted (this rank's keys, rowAt, cnt,
// plo and phi set), so parseSelect need not decode this member's own
// frame. Rows already in Compare order (a top-K that returns its
// candidates best first) are not sorted again. After an error g.buf holds
// a partial frame (never sent).
func (g *Group) encodeSelect(local [][]Candidate, k []int) error {
	rows := len(local)
	if len(k) != rows {
		return fmt.Errorf("%d candidate rows but %d budgets", rows, len(k))
	}
	total, maxRow := 0, 0
	for _, c := range local {
		total += len(c)
		maxRow = max(maxRow, len(c))
	}
	g.rowAt = growInts(g.rowAt, g.size*rows)
	g.cnt = growInts(g.cnt, g.size*rows)
	g.plo = growU32(g.plo, g.size*rows)
	g.phi = growU32(g.phi, g.size*rows)
	g.kh = hashBudgets(k)
	cntAt := selectHeaderLen + candidateLen*total
	b := growBytes(g.buf, cntAt+4*rows)
	g.buf = b
	putHeader(b, kindData, OpSelect)
	binary.LittleEndian.PutUint32(b[headerLen:], uint32(rows))
	binary.LittleEndian.PutUint64(b[headerLen+4:], g.kh)
	// The keys are sorted in place in the frame when it can hold them as
	// uint64s, else in g.all and then written to the frame.
	own, view := keysView(b[selectHeaderLen:cntAt])
	if !view || g.copyKeys {
		view = false
		g.all = slices.Grow(g.all[:0], total)[:total]
		own = g.all
	}
	// Each row is validated, sorted and written in one go, while its keys
	// are in L1: its keys are made in the frame and, unless they come in
	// Compare order, copied to g.in and sorted back into the frame.
	if cap(g.in) < maxRow {
		g.in = make([]uint64, maxRow)
	}
	at := 0
	g.ownDup = false
	for row, c := range local {
		if k[row] < 0 {
			return fmt.Errorf("row %d: budget %d < 0", row, k[row])
		}
		if len(c) > k[row] {
			return fmt.Errorf("row %d: %d local candidates exceed the budget %d", row, len(c), k[row])
		}
		// The keys go to the frame; a row not in Compare order is then
		// sorted from a copy (g.in) back into it.
		keys := own[at : at+len(c)]
		i, slo, shi, plo, phi, strict := putKeys(keys, c)
		if i >= 0 {
			if x := c[i]; x.Score != x.Score {
				return fmt.Errorf("row %d: page %d has a NaN score", row, x.Page)
			}
			return fmt.Errorf("row %d: negative page %d", row, c[i].Page)
		}
		// A row in Compare order (a top-K that returns its candidates
		// best first) is not sorted.
		if !strict {
			in := g.in[:len(c)]
			copy(in, keys)
			if !g.sorter.sortKeys(keys, in, slo, shi) {
				// A candidate given twice: the frame fails every member's
				// check, this one's too (parseSelect then decodes it).
				g.ownDup = true
			}
		}
		binary.LittleEndian.PutUint32(b[cntAt+4*row:], uint32(len(c)))
		j := row*g.size + g.rank
		g.rowAt[j], g.cnt[j], g.plo[j], g.phi[j] = at, len(c), plo, phi
		at += len(c)
	}
	if !view {
		putKeysLE(b[selectHeaderLen:cntAt], own)
	}
	g.keys[g.rank] = own
	return nil
}

// keysView returns b as the little-endian uint64s it holds, without a
// copy, when this machine is little-endian and b is 8-byte aligned
// (view true).
func keysView(b []byte) (keys []uint64, view bool) {
	if !nativeLittle || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 != 0 {
		return nil, false
	}
	if len(b) < candidateLen {
		return []uint64{}, true
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/candidateLen), true
}

// putKeysLE writes keys to b as little-endian uint64s.
func putKeysLE(b []byte, keys []uint64) {
	for i, k := range keys {
		binary.LittleEndian.PutUint64(b[candidateLen*i:], k)
	}
}

// putKeys sets keys[i] to sortKey(c[i]) and returns the smallest and
// largest score part (key>>32) and page, and whether the keys ascend
// strictly (c in Compare order, no candidate twice). It returns as i the
// index of the first candidate with a NaN score or a negative page (its
// key and those after it are not set), or -1.
func putKeys(keys []uint64, c []Candidate) (i int, slo, shi, plo, phi uint32, strict bool) {
	keys = keys[:len(c)]
	slo, plo = math.MaxUint32, math.MaxUint32
	// prev: the last key written; 0 is below every valid key (minKey).
	prev, down := uint64(0), false
	for i, x := range c {
		score, page := math.Float32bits(x.Score), uint32(x.Page)
		if score&^(1<<31) > 0x7f800000 || int32(page) < 0 {
			return i, slo, shi, plo, phi, false
		}
		key := keyOf(score, page)
		keys[i] = key
		down = down || key <= prev
		prev = key
		sp := uint32(key >> 32)
		slo, shi = min(slo, sp), max(shi, sp)
		plo, phi = min(plo, page), max(phi, page)
	}
	return -1, slo, shi, plo, phi, !down
}

// checkKeys returns the smallest and largest page of keys. It returns as
// i -1 when every key is valid (validKey) and the keys ascend strictly;
// otherwise the index of the first key that is invalid (bad true) or not
// above the one before it (bad false).
func checkKeys(keys []uint64) (i int, bad bool, plo, phi uint32) {
	prev := uint64(0) // below every valid key (minKey > 0)
	plo = math.MaxUint32
	for i, key := range keys {
		if !validKey(key) {
			return i, true, plo, phi
		}
		if key <= prev {
			return i, false, plo, phi
		}
		prev = key
		page := uint32(key)
		plo, phi = min(plo, page), max(phi, page)
	}
	return -1, false, plo, phi
}

// strictlyAscending reports whether keys ascend strictly. It stops at the
// first step down, so it costs little on unsorted rows.
func strictlyAscending(keys []uint64) bool {
	for i := 1; i < len(keys); i++ {
		if keys[i] <= keys[i-1] {
			return false
		}
	}
	return true
}

func growInts(b []int, n int) []int {
	if cap(b) < n {
		return make([]int, n)
	}
	return b[:n]
}

func growU32(b []uint32, n int) []uint32 {
	if cap(b) < n {
		return make([]uint32, n)
	}
	return b[:n]
}

// parseSelect checks every peer's frame (and this member's own when its
// input had a duplicate candidate) and sets g.keys[r] to its candidates'
// sort keys, recording where each (row, rank) starts in g.rowAt, its
// count in g.cnt and its page range in g.plo and g.phi.
func (g *Group) parseSelect(rows int, k []int) error {
	for r := range g.size {
		if err := g.parseRank(r, rows, k); err != nil {
			return err
		}
	}
	return nil
}

// parseRank is parseSelect for rank r's frame alone (nothing for this
// member's own frame unless its input had a duplicate candidate).
func (g *Group) parseRank(r, rows int, k []int) error {
	if r == g.rank && !g.ownDup {
		return nil
	}
	keys, err := parseSelectPages(g.recv[r], rows, k, g.kh, g.rowAt[r:], g.cnt[r:], g.plo[r:], g.phi[r:], g.size, !g.copyKeys, &g.scr[r])
	if err != nil {
		return &RankError{Rank: r, Err: err}
	}
	g.keys[r] = keys
	return nil
}

// parseSelectFrame checks one select frame against the expected rows and
// budgets (counts, lengths, keys valid and strictly ascending in each
// row) and returns its keys, rows one after another: a view of b's bytes
// when keysView allows, else a copy in *scratch. rowAt[row*stride] and
// cnt[row*stride] get where each row starts in them and its count.
func parseSelectFrame(b []byte, rows int, k []int, kh uint64, rowAt, cnt []int, stride int, scratch *[]uint64) ([]uint64, error) {
	return parseSelectPages(b, rows, k, kh, rowAt, cnt, nil, nil, stride, true, scratch)
}

// parseSelectPages is parseSelectFrame that also sets plo[row*stride] and
// phi[row*stride] to the smallest and largest page of each row (when plo
// and phi are not nil), and copies the keys when view is false.
func parseSelectPages(b []byte, rows int, k []int, kh uint64, rowAt, cnt []int, plo, phi []uint32, stride int, view bool, scratch *[]uint64) ([]uint64, error) {
	if len(b) < selectHeaderLen {
		return nil, fmt.Errorf("%w: select frame of %d bytes", ErrBadMessage, len(b))
	}
	if n := binary.LittleEndian.Uint32(b[headerLen:]); int64(n) != int64(rows) {
		return nil, fmt.Errorf("%w: %d rows, want %d", ErrBadMessage, n, rows)
	}
	if h := binary.LittleEndian.Uint64(b[headerLen+4:]); h != kh {
		return nil, fmt.Errorf("%w: budgets differ from this member's", ErrBadMessage)
	}
	cntAt := len(b) - 4*rows
	if cntAt < selectHeaderLen {
		return nil, fmt.Errorf("%w: %d-byte frame for %d rows", ErrBadMessage, len(b), rows)
	}
	total := 0
	for row := range rows {
		n := binary.LittleEndian.Uint32(b[cntAt+4*row:])
		if int64(n) > int64(k[row]) {
			return nil, fmt.Errorf("%w: row %d has %d candidates, budget %d", ErrBadMessage, row, n, k[row])
		}
		rowAt[row*stride], cnt[row*stride] = total, int(n)
		total += int(n)
	}
	region := b[selectHeaderLen:cntAt]
	if len(region) != candidateLen*total {
		return nil, fmt.Errorf("%w: %d bytes of keys for %d candidates", ErrBadMessage, len(region), total)
	}
	keys, ok := keysView(region)
	if !ok || !view {
		*scratch = slices.Grow((*scratch)[:0], total)[:total]
		keys = *scratch
		for i := range keys {
			keys[i] = binary.LittleEndian.Uint64(region[candidateLen*i:])
		}
	}
	for row := range rows {
		at, n := rowAt[row*stride], cnt[row*stride]
		i, bad, lo, hi := checkKeys(keys[at : at+n])
		if i >= 0 {
			if bad {
				x := fromKey(keys[at+i])
				return nil, fmt.Errorf("%w: row %d: bad candidate (%v, %d)", ErrBadMessage, row, x.Score, x.Page)
			}
			return nil, fmt.Errorf("%w: row %d: candidates not in selection order", ErrBadMessage, row)
		}
		if plo != nil {
			plo[row*stride], phi[row*stride] = lo, hi
		}
	}
	return keys, nil
}

// checkState validates a partial state's shape and its lse values (finite
// or -Inf; NaN and +Inf would poison the merge).
func checkState(d int, o, lse []float32) error {
	if d <= 0 {
		return fmt.Errorf("head dim %d <= 0", d)
	}
	if len(o) != len(lse)*d {
		return fmt.Errorf("o has %d floats, want %d heads x %d", len(o), len(lse), d)
	}
	return checkLSE(lse)
}

func checkLSE(lse []float32) error {
	for h, x := range lse {
		if x != x || math.IsInf(float64(x), 1) {
			return fmt.Errorf("lse[%d] = %v", h, x)
		}
	}
	return nil
}

func (g *Group) encodeState(op Op, d int, o, lse []float32) {
	n := len(lse)
	b := growBytes(g.buf, stateHeaderLen+4*(len(o)+n))
	g.buf = b
	putHeader(b, kindData, op)
	binary.LittleEndian.PutUint32(b[headerLen:], uint32(n))
	binary.LittleEndian.PutUint32(b[headerLen+4:], uint32(d))
	putF32s(b[stateHeaderLen:], o)
	putF32s(b[stateHeaderLen+4*len(o):], lse)
}

// checkStateFrame checks a received state frame against (n, d) and returns
// its o and lse bytes.
func checkStateFrame(b []byte, n, d int) (ob, lb []byte, err error) {
	if len(b) < stateHeaderLen {
		return nil, nil, fmt.Errorf("%w: state frame of %d bytes", ErrBadMessage, len(b))
	}
	gn, gd := binary.LittleEndian.Uint32(b[headerLen:]), binary.LittleEndian.Uint32(b[headerLen+4:])
	if int64(gn) != int64(n) || int64(gd) != int64(d) {
		return nil, nil, fmt.Errorf("%w: state of %d heads x %d, want %d x %d", ErrBadMessage, gn, gd, n, d)
	}
	if want := stateHeaderLen + 4*(n*d+n); len(b) != want {
		return nil, nil, fmt.Errorf("%w: state frame of %d bytes, want %d", ErrBadMessage, len(b), want)
	}
	ob = b[stateHeaderLen:][:4*n*d]
	lb = b[stateHeaderLen+4*n*d:]
	return ob, lb, nil
}

// Reduce merges the members' partial states into root's o and lse. o is
// [heads][d] and lse [heads] (natural log; the empty state is (0, -Inf));
// every member passes the same d and number of heads. Non-root members send
// their state to root as raw little-endian float32s and return; their o
// and lse are not changed. The root merges the states with
// kernels.MergeStates in rank order (rank 0 first, whatever the root), so
// the result does not depend on arrival order, and writes it to its o and
// lse only on success. Heads empty on every member come out as (0, -Inf);
// lse values must be finite or -Inf.
func (g *Group) Reduce(ctx context.Context, tag uint64, root, d int, o, lse []float32) error {
	if err := g.reduce(ctx, tag, OpReduce, root, d, o, lse); err != nil {
		return fmt.Errorf("reduce tag %#x: %w", tag, err)
	}
	return nil
}

// AllReduce merges the members' partial states like Reduce with root 0 and
// sends the merged state back to every member: all members end with the
// same bits in o and lse. It moves 2*(N-1) states per call.
func (g *Group) AllReduce(ctx context.Context, tag uint64, d int, o, lse []float32) error {
	if err := g.reduce(ctx, tag, OpAllReduce, 0, d, o, lse); err != nil {
		return fmt.Errorf("allreduce tag %#x: %w", tag, err)
	}
	return nil
}

func (g *Group) reduce(ctx context.Context, tag uint64, op Op, root, d int, o, lse []float32) error {
	if err := checkRank(root, g.size); err != nil {
		return err // every member gets the same bad root
	}
	clear(g.sent)
	defer clear(g.recv)
	all := op == OpAllReduce
	if g.rank != root {
		if err := checkState(d, o, lse); err != nil {
			g.abortPeers(ctx, tag, op, err, func(r int) bool { return r == root })
			return err
		}
		g.encodeState(op, d, o, lse)
		if err := g.sendTo(ctx, root, tag); err != nil {
			g.abortPeers(ctx, tag, op, err, func(r int) bool { return r == root })
			return err
		}
		if !all {
			return nil
		}
		msg, err := g.recvFrom(ctx, root, tag, op)
		if err != nil {
			return err
		}
		ob, lb, err := checkStateFrame(msg, len(lse), d)
		if err == nil {
			err = checkLSE(bytesF32(lb, &g.tmp))
		}
		if err != nil {
			return &RankError{Rank: root, Err: err}
		}
		getF32s(o, ob)
		copy(lse, g.tmp)
		return nil
	}

	// Root.
	fail := func(err error) error {
		if all {
			g.abortUnsent(ctx, tag, op, err)
		}
		return err
	}
	if err := checkState(d, o, lse); err != nil {
		return fail(err)
	}
	n := len(lse)
	for r := range g.size {
		if r == root {
			continue
		}
		msg, err := g.recvFrom(ctx, r, tag, op)
		if err != nil {
			return fail(err)
		}
		_, lb, err := checkStateFrame(msg, n, d)
		if err == nil {
			err = checkLSE(bytesF32(lb, &g.tmp))
		}
		if err != nil {
			return fail(&RankError{Rank: r, Err: err})
		}
		g.recv[r] = msg
	}
	g.acc = growF32(g.acc, n*d+n)
	acco, accl := g.acc[:n*d], g.acc[n*d:]
	clear(acco)
	for h := range accl {
		accl[h] = float32(math.Inf(-1))
	}
	g.tmp = growF32(g.tmp, n*d+n)
	for r := range g.size {
		if r == root {
			kernels.MergeStates(d, acco, accl, o, lse)
			continue
		}
		getF32s(g.tmp, g.recv[r][stateHeaderLen:])
		kernels.MergeStates(d, acco, accl, g.tmp[:n*d], g.tmp[n*d:])
	}
	if all {
		g.encodeState(op, d, acco, accl)
		for i := 1; i < g.size; i++ {
			r := (g.rank + i) % g.size
			if err := g.sendTo(ctx, r, tag); err != nil {
				return fail(err)
			}
		}
	}
	copy(o, acco)
	copy(lse, accl)
	return nil
}

// bytesF32 decodes little-endian float32s from b into *scratch (grown as
// needed) and returns them.
func bytesF32(b []byte, scratch *[]float32) []float32 {
	*scratch = growF32(*scratch, len(b)/4)
	getF32s(*scratch, b)
	return *scratch
}
