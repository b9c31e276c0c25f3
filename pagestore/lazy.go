package pagestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/questrt/questrt/pagestore/tier"
)

// Verify is when a persisting store ([Config.DataDir]) reads and checks
// the page payloads it recovers; see the package doc, "Persistence".
type Verify int

const (
	// VerifyAtOpen (the default): [New] reads every recovered page's
	// payload, checks its checksum and recomputes its summaries from
	// its keys; a page that fails makes its sequences damaged in
	// [Store.Recovery].
	VerifyAtOpen Verify = iota
	// VerifyOnRead: [New] reads the metadata and each page's persisted
	// summary record only (a page without a usable record is read as
	// with VerifyAtOpen). A page's payload is read and checked
	// (checksum, and its persisted summaries against the summaries of
	// its keys, bit for bit) at the first operation on a sequence that
	// names it and reads its pages (Len and LayerLen do not), or before
	// that by the background scrub
	// ([Config.ScrubRate], [Store.Scrub]). A page that fails damages
	// the sequences naming it: the operation returns an error wrapping
	// [ErrDamaged] and tier.ErrCorrupt, the sequence is released, and
	// nothing else changes.
	VerifyOnRead
)

// String returns "at-open" or "on-read".
func (v Verify) String() string {
	switch v {
	case VerifyAtOpen:
		return "at-open"
	case VerifyOnRead:
		return "on-read"
	}
	return fmt.Sprintf("Verify(%d)", int(v))
}

// ParseVerify parses "at-open" or "on-read" (the names String gives;
// "" means at-open).
func ParseVerify(s string) (Verify, error) {
	switch s {
	case "", "at-open":
		return VerifyAtOpen, nil
	case "on-read":
		return VerifyOnRead, nil
	}
	return 0, fmt.Errorf("%w: unknown verify mode %q (want at-open or on-read)", ErrInvalidConfig, s)
}

// DefaultScrubRate is the default [Config.ScrubRate]: 64 MiB/s, a small
// share of a local SSD's read bandwidth, so that the scrub does not slow
// the first steps of the recovered sequences (whose pages are read at
// first use, whatever the scrub does) yet verifies a directory of 100
// GiB in under half an hour.
const DefaultScrubRate = 64 << 20

// ScrubReport says what a [VerifyOnRead] store has read and checked of
// its recovered pages since [New].
type ScrubReport struct {
	// Pending is the number of recovered pages not read yet.
	Pending int
	// Verified is the number of pages read and checked since the open
	// (at first use or by the scrub), BytesRead their payload bytes.
	Verified  int
	BytesRead int64
	// CorruptSlots are the slab slots whose page failed its check.
	CorruptSlots []int
	// Damaged are the sequences released because a page of theirs
	// failed its check (Err wraps ErrDamaged and tier.ErrCorrupt).
	Damaged []DamagedSeq
	// Running says the background scrub has not finished (pages
	// pending, not stopped by Close).
	Running bool
}

// lazyState is VerifyOnRead's state. loadMu serializes page loads
// (lock order: a sequence, loadMu, then the store's other locks); mu, a
// leaf, guards bad, the counters and the reports.
type lazyState struct {
	loadMu sync.Mutex

	mu       sync.Mutex
	pending  int                // pages with pend >= 0
	bad      map[int32]error    // page: its load failed (until freed)
	damaged  map[SeqID]error    // released by a failed load
	rep      ScrubReport        // Verified, BytesRead, CorruptSlots, Damaged
	cancel   context.CancelFunc // the scrub's
	done     chan struct{}      // closed when the scrub returns
	finished bool               // the scrub returned
}

func (l *lazyState) init() {
	l.bad = map[int32]error{}
	l.damaged = map[SeqID]error{}
}

// sumLen is the bytes of one page's summary record: every layer's
// Summary records of the page, little-endian float32.
func (s *Store) sumLen() int { return s.cfg.Layers * s.host.sumPage * 4 }

// sumBytes appends page p's summaries (every layer's) to dst.
func (s *Store) sumBytes(p int32, dst []byte) []byte {
	h := s.host
	if dst == nil {
		dst = make([]byte, 0, s.sumLen())
	}
	o := int(p) * h.sumPage
	for _, ld := range h.layers {
		for _, x := range ld.Summary[o : o+h.sumPage] {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
		}
	}
	return dst
}

// setSum puts a summary record (sumBytes's layout) into page p.
func (s *Store) setSum(p int32, b []byte) {
	h := s.host
	o := int(p) * h.sumPage
	for _, ld := range h.layers {
		rec := ld.Summary[o : o+h.sumPage]
		for i := range rec {
			rec[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		b = b[4*h.sumPage:]
	}
}

// readSlot reads slot sl's payload into buf and checks it against crc,
// its slot record's checksum.
func (pr *persist) readSlot(ctx context.Context, sl int32, crc uint32, buf []byte) error {
	pr.bytesRead.Add(int64(len(buf)))
	if err := pr.dt.Read(ctx, int(sl), buf); err != nil {
		return err
	}
	if got := crc32.Checksum(buf, castagnoli); got != crc {
		return fmt.Errorf("slot %d payload checksum %08x, record has %08x: %w", sl, got, crc, tier.ErrCorrupt)
	}
	return nil
}

// dropPendingLocked forgets page p's pending load and failure: p was
// freed (pr.mu held).
func (pr *persist) dropPendingLocked(p int32) {
	if pr.pend[p] >= 0 {
		pr.pend[p] = -1
		pr.lazy.mu.Lock()
		pr.lazy.pending--
		pr.lazy.mu.Unlock()
	}
	pr.lazy.mu.Lock()
	delete(pr.lazy.bad, p)
	pr.lazy.mu.Unlock()
}

// gone is the error of an operation on id, which is not live:
// ErrUnknownSequence, or the ErrDamaged error that released it.
func (s *Store) gone(id SeqID) error {
	if pr := s.pers; pr != nil {
		pr.lazy.mu.Lock()
		err := pr.lazy.damaged[id]
		pr.lazy.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return ErrUnknownSequence
}

// lockNoLoad is lock without the first-use load: sq may be pending.
func (s *Store) lockNoLoad(id SeqID) (*seq, error) {
	s.seqMu.RLock()
	sq, ok := s.seqs[id]
	s.seqMu.RUnlock()
	if !ok {
		return nil, s.gone(id)
	}
	sq.mu.Lock()
	if sq.released { // released between the lookup and the lock
		sq.mu.Unlock()
		return nil, s.gone(id)
	}
	return sq, nil
}

// loadSeq reads and checks every pending page of sq (sq locked, pend
// set) and returns the first failure (the caller damages sq: see
// damage).
func (s *Store) loadSeq(sq *seq) error {
	for i, p := range sq.pages {
		if _, err := s.loadPage(context.Background(), p, i, sq.lens); err != nil {
			return fmt.Errorf("page %d: %w", i, err)
		}
	}
	sq.pend = false
	return nil
}

// loadPage reads page p's payload (logical page idx of a sequence of
// lengths lens, locked by the caller, so p stays referenced), when it
// is pending: it checks the payload's checksum, puts it in place
// (restorePage) and checks that the summaries recomputed from its keys
// equal the persisted ones bit for bit. It returns the bytes read, and
// the page's failure (also for later loads of it) wrapping
// tier.ErrCorrupt. A cancelled ctx changes nothing.
func (s *Store) loadPage(ctx context.Context, p int32, idx int, lens []int) (int, error) {
	pr := s.pers
	pr.lazy.loadMu.Lock()
	defer pr.lazy.loadMu.Unlock()
	pr.lazy.mu.Lock()
	bad := pr.lazy.bad[p]
	pr.lazy.mu.Unlock()
	if bad != nil {
		return 0, bad
	}
	pr.mu.Lock()
	sl, crc := pr.pend[p], pr.pendCRC[p]
	pr.mu.Unlock()
	if sl < 0 {
		return 0, nil
	}
	n := s.cfg.PayloadBytes()
	b := pr.buf(n)
	defer pr.putBuf(b)
	err := pr.readSlot(ctx, sl, crc, b)
	if err != nil && ctx.Err() != nil {
		return 0, err
	}
	if err == nil {
		want := s.sumBytes(p, nil)
		if err = s.restorePage(p, b, idx, lens); err == nil {
			if got := s.sumBytes(p, nil); !bytes.Equal(got, want) {
				i := 0
				for i < len(got) && got[i] == want[i] {
					i++
				}
				err = fmt.Errorf("slot %d: persisted summaries differ from the summaries of its keys (layer %d): %w", sl, i/(4*s.host.sumPage), tier.ErrCorrupt)
			}
		}
	}
	pr.mu.Lock()
	pr.pend[p] = -1
	pr.mu.Unlock()
	l := &pr.lazy
	l.mu.Lock()
	l.pending--
	l.rep.Verified++
	l.rep.BytesRead += int64(n)
	if err != nil {
		l.bad[p] = err
		l.rep.CorruptSlots = append(l.rep.CorruptSlots, int(sl))
	}
	l.mu.Unlock()
	return n, err
}

// damage releases sq (not locked by the caller), whose page failed its
// check with cause, as Release does (in Release's lock order: the map,
// then the sequence; its manifest deleted), records it and returns the
// error every operation on id returns from now on. When a Release or
// another damage took sq first, it returns what an operation on id
// then gets.
func (s *Store) damage(id SeqID, sq *seq, cause error) error {
	pr := s.pers
	err := fmt.Errorf("seq %d: %w: %w", id, ErrDamaged, cause)
	s.seqMu.Lock()
	own := s.seqs[id] == sq
	if own {
		delete(s.seqs, id)
		pr.lazy.mu.Lock()
		pr.lazy.damaged[id] = err
		pr.lazy.mu.Unlock()
	}
	s.seqMu.Unlock()
	if !own {
		return s.gone(id)
	}
	sq.mu.Lock()
	defer sq.mu.Unlock()
	pr.lazy.mu.Lock()
	pr.lazy.rep.Damaged = append(pr.lazy.rep.Damaged, DamagedSeq{ID: id, Tokens: maxLen(sq.lens), Err: err})
	pr.lazy.mu.Unlock()
	s.releasePages(sq)
	sq.pend = false
	// Best effort, as Create's: a failure leaves the manifest, which the
	// next open finds damaged again.
	_ = s.data.Drop(id)
	_ = s.persistRelease(id, sq)
	return err
}

// startScrub starts the background scrub of a VerifyOnRead store with
// pages pending (and a positive rate): it reads the pending pages of
// every recovered sequence, one page at a time under the sequence's
// lock, at most ScrubRate bytes per second, until none is pending or
// Close (stopScrub).
func (s *Store) startScrub() {
	pr := s.pers
	rate := s.cfg.scrubRate()
	l := &pr.lazy
	l.mu.Lock()
	l.pending = pr.report.Pending
	l.mu.Unlock()
	if s.cfg.Verify != VerifyOnRead || rate <= 0 || pr.report.Pending == 0 {
		return
	}
	var ids []SeqID
	for _, r := range pr.report.Sequences {
		ids = append(ids, r.ID)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel, l.done = cancel, make(chan struct{})
	go func() {
		defer close(l.done)
		s.scrub(ctx, ids, rate)
		l.mu.Lock()
		l.finished = true
		l.mu.Unlock()
	}()
}

// stopScrub stops the scrub and waits for it.
func (s *Store) stopScrub() {
	l := &s.pers.lazy
	if l.cancel != nil {
		l.cancel()
		<-l.done
		l.cancel = nil
	}
}

func (s *Store) scrub(ctx context.Context, ids []SeqID, rate int64) {
	var owed int64 // bytes read and not yet paid for by a pause
	for _, id := range ids {
		for i := 0; ; i++ {
			if ctx.Err() != nil {
				return
			}
			sq, err := s.lockNoLoad(id)
			if err != nil {
				break // released or damaged
			}
			if !sq.pend || i >= len(sq.pages) {
				sq.pend = false
				sq.mu.Unlock()
				break
			}
			n, err := s.loadPage(ctx, sq.pages[i], i, sq.lens)
			if err != nil {
				if ctx.Err() != nil {
					sq.mu.Unlock()
					return
				}
				sq.mu.Unlock()
				_ = s.damage(id, sq, fmt.Errorf("page %d: %w", i, err))
				break
			}
			sq.mu.Unlock()
			owed += int64(n)
			if d := time.Duration(owed * int64(time.Second) / rate); d >= time.Millisecond {
				owed = 0
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
		}
	}
}

// DamagedFrom returns the sequences a [VerifyOnRead] store released
// since [New] because a page of theirs failed its check (at first use
// or by the scrub), from the from-th on, in the order they were found:
// [ScrubReport.Damaged][from:], without copying the rest of the report.
// A caller that keeps how many it has seen learns of each once.
func (s *Store) DamagedFrom(from int) []DamagedSeq {
	pr := s.pers
	if pr == nil {
		return nil
	}
	l := &pr.lazy
	l.mu.Lock()
	defer l.mu.Unlock()
	if from >= len(l.rep.Damaged) {
		return nil
	}
	return slices.Clone(l.rep.Damaged[from:])
}

// Scrub says what a [VerifyOnRead] store has read and checked of its
// recovered pages since [New] (a zero report otherwise).
func (s *Store) Scrub() ScrubReport {
	pr := s.pers
	if pr == nil {
		return ScrubReport{}
	}
	l := &pr.lazy
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rep
	r.Pending = l.pending
	r.CorruptSlots = slices.Clone(r.CorruptSlots)
	slices.Sort(r.CorruptSlots)
	r.Damaged = slices.Clone(r.Damaged)
	r.Running = l.done != nil && !l.finished
	return r
}
