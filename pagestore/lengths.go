package pagestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/questrt/questrt/pagestore/tier"
)

// The lengths file (DIR/lengths) says, after a process crash, how many
// tokens each sequence held in each layer: the tail tokens past its
// sealed pages are lost, and recovery reports them. It is written, not
// synced, at every append; a process crash (kill -9) leaves the page
// cache's bytes, a power loss may leave older ones.
//
// Format 1 (directories written before the per-layer record): no
// header; record r at 16*r: the sequence id (u64), its longest layer's
// length (u32), the CRC32C of those 12 bytes. Read at recovery as
// before (the longest layer only), then the file is rewritten in
// format 2.
//
// Format 2: every block is recSize bytes (16 + 8 per layer, rounded up
// to a power of two, so that no block crosses a 4 KiB page): block 0 is
// the header, block 1+r record r. Header: lensMagic, the format (u32),
// the layer count (u32), a CRC32C of those 16 bytes. Record: the
// sequence id (u64), the layer count (u32), a CRC32C of those 12 bytes;
// then per layer its length (u32) and a CRC32C of (id, layer, length).
// An append writes only its layer's 8 bytes (one write, as format 1's
// 16); Create, Fork, Rollback and recovery write the record whole, a
// Release zeroes it. Every CRC is seeded with lensSeed, so no format-2
// block reads as a valid format-1 record.
const (
	lensFormat1   = 1
	lensFormat2   = 2
	lenRecBytesV1 = 16
	lensHeadBytes = 16
	lensEntry     = 8
)

// lensMagic opens a format-2 lengths file: no byte is zero, so a
// format-1 file (whose first 8 bytes are a sequence id, at most a few
// low bytes non-zero) never matches it in 6 of its 8 bytes, and a
// format-2 header with one damaged byte still does.
var lensMagic = [8]byte{'Q', 'R', 'T', 'L', 'E', 'N', 'S', 0x1a}

var lensSeed = crc32.Checksum([]byte("questrt lengths v2"), castagnoli)

func lensCRC(b ...[]byte) uint32 {
	c := lensSeed
	for _, x := range b {
		c = crc32.Update(c, castagnoli, x)
	}
	return c
}

// lensFile is what the lengths file held at open.
type lensFile struct {
	layers  int
	recSize int
	// format is the file's format at open: 0 (empty: a new directory),
	// lensFormat1 or lensFormat2. Recovery rewrites any but format 2
	// with a sound header.
	format int
	// raw is the file's contents at open (recovery reads the records
	// from it; nil afterwards).
	raw []byte
	// headErr is the header's failed check (format 2): no record of
	// the file is read.
	headErr error
}

func lensRecSize(layers int) int {
	n := 32
	for n < lensHeadBytes+lensEntry*layers {
		n *= 2
	}
	return n
}

// recOff is the offset of record rec (format 2).
func (f *lensFile) recOff(rec int32) int64 { return int64(rec+1) * int64(f.recSize) }

// readLensFile reads the lengths file f of a store of layers layers and
// says its format. A damaged header is not an error of the open (the
// file is best effort): it makes every record unknown, said by headErr.
func readLensFile(f *os.File, layers int) (lensFile, error) {
	lf := lensFile{layers: layers, recSize: lensRecSize(layers)}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return lf, err
	}
	raw, err := io.ReadAll(f)
	if err != nil {
		return lf, err
	}
	lf.raw = raw
	if len(raw) == 0 {
		return lf, nil
	}
	same := 0
	for i := range min(len(raw), len(lensMagic)) {
		if raw[i] == lensMagic[i] {
			same++
		}
	}
	if same < 6 {
		lf.format = lensFormat1
		return lf, nil
	}
	lf.format = lensFormat2
	if len(raw) < lensHeadBytes+4 {
		lf.headErr = fmt.Errorf("lengths file header: %d bytes: %w", len(raw), tier.ErrCorrupt)
		return lf, nil
	}
	h := raw[:lensHeadBytes]
	switch want := binary.LittleEndian.Uint32(raw[lensHeadBytes:]); {
	case want != lensCRC(h):
		lf.headErr = fmt.Errorf("lengths file header: checksum %08x, stored %08x: %w", lensCRC(h), want, tier.ErrCorrupt)
	case !bytes.Equal(h[:8], lensMagic[:]):
		lf.headErr = fmt.Errorf("lengths file header: magic %q: %w", h[:8], tier.ErrCorrupt)
	case binary.LittleEndian.Uint32(h[8:]) != lensFormat2 || int(binary.LittleEndian.Uint32(h[12:])) != layers:
		// Sound but not ours (a later format, or another geometry):
		// its records are not read, and it is rewritten.
		lf.headErr = fmt.Errorf("lengths file of format %d for %d layers, want format %d for %d: %w",
			binary.LittleEndian.Uint32(h[8:]), binary.LittleEndian.Uint32(h[12:]), lensFormat2, layers, tier.ErrCorrupt)
	}
	return lf, nil
}

// header returns the format-2 header block.
func (f *lensFile) header() []byte {
	b := make([]byte, f.recSize)
	copy(b, lensMagic[:])
	binary.LittleEndian.PutUint32(b[8:], lensFormat2)
	binary.LittleEndian.PutUint32(b[12:], uint32(f.layers))
	binary.LittleEndian.PutUint32(b[lensHeadBytes:], lensCRC(b[:lensHeadBytes]))
	return b
}

// record returns id's format-2 record for the per-layer lengths lens.
func (f *lensFile) record(id SeqID, lens []int) []byte {
	b := make([]byte, f.recSize)
	binary.LittleEndian.PutUint64(b[0:], uint64(id))
	binary.LittleEndian.PutUint32(b[8:], uint32(len(lens)))
	binary.LittleEndian.PutUint32(b[12:], lensCRC(b[:12]))
	for l, n := range lens {
		putLensEntry(b[lensHeadBytes+lensEntry*l:], id, l, n)
	}
	return b
}

// putLensEntry writes layer l's entry of id's record (length n) to b.
func putLensEntry(b []byte, id SeqID, l, n int) {
	var key [12]byte
	binary.LittleEndian.PutUint64(key[0:], uint64(id))
	binary.LittleEndian.PutUint32(key[8:], uint32(l))
	binary.LittleEndian.PutUint32(b[0:], uint32(n))
	binary.LittleEndian.PutUint32(b[4:], lensCRC(key[:], b[0:4]))
}

// errNoRecord says that a sequence's length record is absent (zeroed
// by a Release that its manifest's deletion did not follow, or never
// written): no loss is known, and nothing is damaged.
var errNoRecord = errors.New("no length record")

// read returns what record rec of the file at open says of id: per
// layer its length (-1 where the layer's entry failed its check; nil
// for a format-1 record, which holds the longest layer only) and the
// longest of them (-1 when none is known). err says why something is
// unknown: errNoRecord, or a failed check wrapping tier.ErrCorrupt.
func (f *lensFile) read(id SeqID, rec int32) (lens []int, hi int, err error) {
	switch {
	case rec < 0 || f.format == 0:
		return nil, -1, errNoRecord
	case f.headErr != nil:
		return nil, -1, f.headErr
	case f.format == lensFormat1:
		off := int64(rec) * lenRecBytesV1
		if off+lenRecBytesV1 > int64(len(f.raw)) {
			return nil, -1, errNoRecord
		}
		b := f.raw[off : off+lenRecBytesV1]
		if isZero(b) {
			return nil, -1, errNoRecord
		}
		if got, want := crc32.Checksum(b[:12], castagnoli), binary.LittleEndian.Uint32(b[12:]); got != want {
			return nil, -1, fmt.Errorf("length record %d (format 1): checksum %08x, stored %08x: %w", rec, got, want, tier.ErrCorrupt)
		}
		if got := SeqID(binary.LittleEndian.Uint64(b)); got != id {
			return nil, -1, fmt.Errorf("length record %d (format 1) names seq %d: %w", rec, got, tier.ErrCorrupt)
		}
		return nil, int(binary.LittleEndian.Uint32(b[8:])), nil
	}
	off := f.recOff(rec)
	if off+int64(f.recSize) > int64(len(f.raw)) {
		return nil, -1, errNoRecord
	}
	b := f.raw[off : off+int64(f.recSize)]
	if isZero(b) {
		return nil, -1, errNoRecord
	}
	if got, want := lensCRC(b[:12]), binary.LittleEndian.Uint32(b[12:]); got != want {
		return nil, -1, fmt.Errorf("length record %d: checksum %08x, stored %08x: %w", rec, got, want, tier.ErrCorrupt)
	}
	if got, n := SeqID(binary.LittleEndian.Uint64(b)), int(binary.LittleEndian.Uint32(b[8:])); got != id || n != f.layers {
		return nil, -1, fmt.Errorf("length record %d names seq %d with %d layers, want seq %d with %d: %w", rec, got, n, id, f.layers, tier.ErrCorrupt)
	}
	lens, hi = make([]int, f.layers), -1
	var errs []error
	var key [12]byte
	binary.LittleEndian.PutUint64(key[0:], uint64(id))
	for l := range lens {
		e := b[lensHeadBytes+lensEntry*l:]
		binary.LittleEndian.PutUint32(key[8:], uint32(l))
		if got, want := lensCRC(key[:], e[0:4]), binary.LittleEndian.Uint32(e[4:]); got != want {
			lens[l] = -1
			errs = append(errs, fmt.Errorf("length record %d layer %d: checksum %08x, stored %08x: %w", rec, l, got, want, tier.ErrCorrupt))
			continue
		}
		lens[l] = int(binary.LittleEndian.Uint32(e))
		hi = max(hi, lens[l])
	}
	return lens, hi, errors.Join(errs...)
}

func isZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// writeLens writes b at off of the lengths file and says whether it
// did. The file is best effort (a record it lacks makes recovery report
// fewer lost tokens, or a bound): a failure is not returned, and
// reported once until a write succeeds again.
func (pr *persist) writeLens(b []byte, off int64) bool {
	var err error
	if fp := pr.fault.Load(); fp != nil {
		err = (*fp)(opLengths, pr.lenF.Name())
	}
	if err == nil {
		_, err = pr.lenF.WriteAt(b, off)
	}
	if err == nil {
		pr.lenBad.Store(false)
		return true
	}
	if !pr.lenBad.Swap(true) {
		_ = pr.fail(opLengths, pr.lenF.Name(), err)
	}
	return false
}

// noteLen writes sq's length record whole (sq locked): its id and every
// layer's length.
func (s *Store) noteLen(id SeqID, sq *seq) {
	pr := s.pers
	sq.lenStale = !pr.writeLens(pr.lens.record(id, sq.lens), pr.lens.recOff(sq.lenRec))
}

// noteLayerLen writes layer's entry of sq's length record (sq locked):
// 8 bytes, written (not synced) at every append, so that after a
// process crash recovery knows exactly how many tokens each layer
// lost. A record a write of which failed is written whole.
func (s *Store) noteLayerLen(id SeqID, sq *seq, layer int) {
	if sq.lenStale {
		s.noteLen(id, sq)
		return
	}
	pr := s.pers
	var b [lensEntry]byte
	putLensEntry(b[:], id, layer, sq.lens[layer])
	sq.lenStale = !pr.writeLens(b[:], pr.lens.recOff(sq.lenRec)+lensHeadBytes+int64(lensEntry*layer))
}

// resetLens starts the lengths file afresh in format 2 (recovery, when
// the file was not in format 2 with a sound header): the header, no
// record yet.
func (pr *persist) resetLens() error {
	return pr.do(opRecover, pr.lenF.Name(), func() error {
		if err := pr.lenF.Truncate(0); err != nil {
			return err
		}
		_, err := pr.lenF.WriteAt(pr.lens.header(), 0)
		return err
	})
}
