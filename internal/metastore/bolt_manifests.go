package metastore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// The bbolt manifests, one file (a page store's store.db):
//
//	meta/format     the geometry: version, layers, KV heads, head
//	                dimension, page size (u32 LE each), then one byte
//	                for fp8 directories
//	meta/next_id    the next sequence id (8 bytes, big-endian)
//	seqs/<id>       a manifest's header: version u8, 3 zero bytes,
//	                lenRec u32, slots u32, layers u32, lens u32 x
//	                layers (8-byte big-endian id)
//	tables/<id><c>  chunk c (u32 BE) of its slot table: up to
//	                chunkSlots slots, u32 LE each
//	slots/<slot>    a slot record: version u8, 3 zero bytes, payload
//	                CRC32C u32 (4-byte big-endian slot)
//	sums/<slot>     the slot's summary record: version u8, 3 zero
//	                bytes, the payload CRC32C it describes u32, the
//	                summary bytes (absent in files written before it:
//	                Init adds the empty bucket, which older code
//	                ignores; a record whose payload CRC32C is not the
//	                slot record's is stale and not returned)
//
// Every value but the format record ends with the CRC32C of its key and
// body. Names, keys and encodings are those of the files written before
// this package existed (worker/testdata/table-v1 holds two).
var (
	bkManMeta   = []byte("meta")
	bkManSeqs   = []byte("seqs")
	bkManTables = []byte("tables")
	bkManSlots  = []byte("slots")
	bkManSums   = []byte("sums")
	kManFormat  = []byte("format")
	kManNextID  = []byte("next_id")
)

const (
	manifestVersion = 1
	chunkSlots      = 1024 // slots per table chunk value (4 KiB)
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// boltManifests are Manifests in a bbolt file.
type boltManifests struct {
	boltFile
	layers atomic.Int64 // Init's format's layers, for Load's checks

	// mu serializes Commit with its cache: committed are the slot
	// tables as last loaded or committed, by id, so that a commit
	// rewrites only the chunks that changed without reading them back
	// (the slices are the callers': see ManifestBatch).
	mu        sync.Mutex
	committed map[uint64][]int32
}

// OpenBoltManifests opens the bbolt manifests at path, creating the
// file (mode 0600); its errors are OpenBolt's.
func OpenBoltManifests(path string, opt Options) (Manifests, error) {
	db, err := openChecked(path, opt, bolt.FreelistMapType)
	if err != nil {
		return nil, err
	}
	return &boltManifests{boltFile: boltFile{db: db, readOnly: opt.ReadOnly}, committed: map[uint64][]int32{}}, nil
}

// encodeManifestFormat is f's format record.
func encodeManifestFormat(f ManifestFormat) []byte {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], manifestVersion)
	binary.LittleEndian.PutUint32(b[4:], uint32(f.Layers))
	binary.LittleEndian.PutUint32(b[8:], uint32(f.KVHeads))
	binary.LittleEndian.PutUint32(b[12:], uint32(f.HeadDim))
	binary.LittleEndian.PutUint32(b[16:], uint32(f.PageSize))
	if f.DType == plan.FP8 {
		// f32 directories keep their 20-byte format; fp8 ones say so.
		b = append(b, byte(plan.FP8))
	}
	return b
}

// ManifestFormatDType returns the page type that a manifest format
// record (a *FormatError's Have or Want from Manifests.Init) names:
// plan.FP8 for the records of fp8 directories, plan.Float32 for the
// 20-byte records of f32 ones.
func ManifestFormatDType(rec []byte) plan.DType {
	if len(rec) > 20 {
		return plan.DType(rec[20])
	}
	return plan.Float32
}

func (m *boltManifests) Init(ctx context.Context, f ManifestFormat) error {
	want := encodeManifestFormat(f)
	err := m.update(ctx, func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bkManMeta, bkManSeqs, bkManTables, bkManSlots, bkManSums} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		mb := tx.Bucket(bkManMeta)
		if have := mb.Get(kManFormat); have != nil && !bytes.Equal(have, want) {
			return &FormatError{Have: bytes.Clone(have), Want: want}
		}
		return mb.Put(kManFormat, want)
	})
	if err == nil {
		m.layers.Store(int64(f.Layers))
	}
	return err
}

func seqKey(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }

func chunkKey(id uint64, c int) []byte { return binary.BigEndian.AppendUint32(seqKey(id), uint32(c)) }

func slotKey(sl int32) []byte { return binary.BigEndian.AppendUint32(nil, uint32(sl)) }

// sealValue appends the CRC32C of key and v to v.
func sealValue(key, v []byte) []byte {
	crc := crc32.Update(crc32.Update(0, castagnoli, key), castagnoli, v)
	return binary.LittleEndian.AppendUint32(v, crc)
}

// openValue checks and strips sealValue's checksum.
func openValue(key, v []byte) ([]byte, error) {
	if len(v) < 4 {
		return nil, fmt.Errorf("value of %d bytes: %w", len(v), tier.ErrCorrupt)
	}
	body := v[:len(v)-4]
	want := binary.LittleEndian.Uint32(v[len(v)-4:])
	if got := crc32.Update(crc32.Update(0, castagnoli, key), castagnoli, body); got != want {
		return nil, fmt.Errorf("value checksum %08x, stored %08x: %w", got, want, tier.ErrCorrupt)
	}
	return body, nil
}

func encodeHeader(m Manifest) []byte {
	b := make([]byte, 16, 16+4*len(m.Lens)+4)
	b[0] = manifestVersion
	binary.LittleEndian.PutUint32(b[4:], uint32(m.LenRec))
	binary.LittleEndian.PutUint32(b[8:], uint32(len(m.Slots)))
	binary.LittleEndian.PutUint32(b[12:], uint32(len(m.Lens)))
	for _, n := range m.Lens {
		b = binary.LittleEndian.AppendUint32(b, uint32(n))
	}
	return sealValue(seqKey(m.ID), b)
}

// decodeHeader decodes manifest id's header: the manifest without its
// slots, and how many it has.
func decodeHeader(id uint64, raw []byte, layers int) (Manifest, int, error) {
	b, err := openValue(seqKey(id), raw)
	if err != nil {
		return Manifest{ID: id}, 0, fmt.Errorf("manifest: %w", err)
	}
	if len(b) < 16 || b[0] != manifestVersion || int(binary.LittleEndian.Uint32(b[12:])) != layers || len(b) != 16+4*layers {
		return Manifest{ID: id}, 0, fmt.Errorf("manifest of %d bytes, version %d: %w", len(b), b[0], tier.ErrCorrupt)
	}
	m := Manifest{ID: id, LenRec: int32(binary.LittleEndian.Uint32(b[4:])), Lens: make([]int, layers)}
	for l := range m.Lens {
		m.Lens[l] = int(binary.LittleEndian.Uint32(b[16+4*l:]))
	}
	return m, int(binary.LittleEndian.Uint32(b[8:])), nil
}

func encodeChunk(id uint64, c int, slots []int32) []byte {
	b := make([]byte, 0, 4*len(slots)+4)
	for _, sl := range slots {
		b = binary.LittleEndian.AppendUint32(b, uint32(sl))
	}
	return sealValue(chunkKey(id, c), b)
}

// encodeSlotRec is slot sl's record of payload checksum crc.
func encodeSlotRec(sl int32, crc uint32) []byte {
	b := make([]byte, 8)
	b[0] = manifestVersion
	binary.LittleEndian.PutUint32(b[4:], crc)
	return sealValue(slotKey(sl), b)
}

// encodeSumRec is slot sl's summary record: sum, describing the
// payload of checksum crc.
func encodeSumRec(sl int32, crc uint32, sum []byte) []byte {
	b := make([]byte, 8, 8+len(sum)+4)
	b[0] = manifestVersion
	binary.LittleEndian.PutUint32(b[4:], crc)
	return sealValue(slotKey(sl), append(b, sum...))
}

func chunkOf(slots []int32, c int) []int32 {
	return slots[c*chunkSlots : min((c+1)*chunkSlots, len(slots))]
}

func (m *boltManifests) Load(ctx context.Context) (Loaded, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	layers := int(m.layers.Load())
	out := Loaded{SlotCRC: map[int32]uint32{}, BadSlots: map[int32]error{}}
	err := m.view(ctx, func(tx *bolt.Tx) error {
		mb, sb, tb, slb := tx.Bucket(bkManMeta), tx.Bucket(bkManSeqs), tx.Bucket(bkManTables), tx.Bucket(bkManSlots)
		if mb == nil || sb == nil || tb == nil || slb == nil {
			return nil // never initialized: empty
		}
		if v := mb.Get(kManNextID); len(v) == 8 {
			out.NextID = binary.BigEndian.Uint64(v)
		}
		err := sb.ForEach(func(k, raw []byte) error {
			if len(k) != 8 {
				return nil
			}
			id := binary.BigEndian.Uint64(k)
			man, n, err := decodeHeader(id, raw, layers)
			for ch := 0; err == nil && ch*chunkSlots < n; ch++ {
				key := chunkKey(id, ch)
				body, cerr := openValue(key, tb.Get(key))
				want := min(chunkSlots, n-ch*chunkSlots)
				if cerr == nil && len(body) != 4*want {
					cerr = fmt.Errorf("%d bytes, want %d slots: %w", len(body), want, tier.ErrCorrupt)
				}
				if cerr != nil {
					err = fmt.Errorf("table chunk %d: %w", ch, cerr)
					break
				}
				for i := range want {
					man.Slots = append(man.Slots, int32(binary.LittleEndian.Uint32(body[4*i:])))
				}
			}
			out.Manifests = append(out.Manifests, ManifestRecord{Manifest: man, Err: corrupt(err)})
			if err == nil {
				m.committed[id] = slices.Clone(man.Slots)
			}
			return nil
		})
		if err != nil {
			return err
		}
		err = slb.ForEach(func(k, raw []byte) error {
			if len(k) != 4 {
				return nil
			}
			sl := int32(binary.BigEndian.Uint32(k))
			body, err := openValue(k, raw)
			if err == nil && (len(body) != 8 || body[0] != manifestVersion) {
				err = fmt.Errorf("slot record of %d bytes: %w", len(body), tier.ErrCorrupt)
			}
			if err != nil {
				out.BadSlots[sl] = corrupt(fmt.Errorf("slot %d record: %w", sl, err))
				return nil
			}
			out.SlotCRC[sl] = binary.LittleEndian.Uint32(body[4:])
			return nil
		})
		if err != nil {
			return err
		}
		smb := tx.Bucket(bkManSums)
		if smb == nil {
			return nil // written before summary records
		}
		return smb.ForEach(func(k, raw []byte) error {
			if len(k) != 4 {
				return nil
			}
			sl := int32(binary.BigEndian.Uint32(k))
			crc, ok := out.SlotCRC[sl]
			if !ok {
				return nil // no valid slot record: the slot is not usable anyway
			}
			body, err := openValue(k, raw)
			if err == nil && (len(body) < 8 || body[0] != manifestVersion) {
				err = fmt.Errorf("summary record of %d bytes: %w", len(body), tier.ErrCorrupt)
			}
			if err != nil {
				if out.BadSummaries == nil {
					out.BadSummaries = map[int32]error{}
				}
				out.BadSummaries[sl] = corrupt(fmt.Errorf("slot %d summary record: %w", sl, err))
				return nil
			}
			if binary.LittleEndian.Uint32(body[4:]) != crc {
				return nil // of an older payload of the slot
			}
			if out.Summaries == nil {
				out.Summaries = map[int32][]byte{}
			}
			out.Summaries[sl] = bytes.Clone(body[8:])
			return nil
		})
	})
	return out, err
}

// deletePrefix deletes every key of b that begins with pre.
func deletePrefix(b *bolt.Bucket, pre []byte) error {
	var ks [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(pre); k != nil && bytes.HasPrefix(k, pre); k, _ = c.Next() {
		ks = append(ks, bytes.Clone(k))
	}
	for _, k := range ks {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

func (m *boltManifests) Commit(ctx context.Context, b ManifestBatch) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	err := m.update(ctx, func(tx *bolt.Tx) error {
		sb, tb, slb, smb := tx.Bucket(bkManSeqs), tx.Bucket(bkManTables), tx.Bucket(bkManSlots), tx.Bucket(bkManSums)
		if sb == nil || tb == nil || slb == nil || smb == nil {
			return fmt.Errorf("metastore: commit manifests before Init")
		}
		for sl, crc := range b.SlotCRC {
			if err := slb.Put(slotKey(sl), encodeSlotRec(sl, crc)); err != nil {
				return err
			}
			var err error
			if sum, ok := b.Summaries[sl]; ok {
				err = smb.Put(slotKey(sl), encodeSumRec(sl, crc, sum))
			} else {
				err = smb.Delete(slotKey(sl))
			}
			if err != nil {
				return err
			}
		}
		for _, man := range b.Put {
			if err := sb.Put(seqKey(man.ID), encodeHeader(man)); err != nil {
				return err
			}
			old, known := m.committed[man.ID]
			nc, oc := (len(man.Slots)+chunkSlots-1)/chunkSlots, (len(old)+chunkSlots-1)/chunkSlots
			for c := range nc {
				if known && c < oc && slices.Equal(chunkOf(old, c), chunkOf(man.Slots, c)) {
					continue // unchanged: not rewritten
				}
				if err := tb.Put(chunkKey(man.ID, c), encodeChunk(man.ID, c, chunkOf(man.Slots, c))); err != nil {
					return err
				}
			}
			// The chunks past the new end (a shorter table).
			var stale [][]byte
			c := tb.Cursor()
			pre := seqKey(man.ID)
			for k, _ := c.Seek(chunkKey(man.ID, nc)); k != nil && bytes.HasPrefix(k, pre); k, _ = c.Next() {
				stale = append(stale, bytes.Clone(k))
			}
			for _, k := range stale {
				if err := tb.Delete(k); err != nil {
					return err
				}
			}
		}
		for _, id := range b.Delete {
			if err := sb.Delete(seqKey(id)); err != nil {
				return err
			}
			if err := deletePrefix(tb, seqKey(id)); err != nil {
				return err
			}
		}
		if b.RetainSlots != nil {
			for _, bk := range []*bolt.Bucket{slb, smb} {
				if err := pruneSlots(bk, b.RetainSlots); err != nil {
					return err
				}
			}
		}
		if b.NextID != 0 {
			return tx.Bucket(bkManMeta).Put(kManNextID, seqKey(b.NextID))
		}
		return nil
	})
	if err != nil {
		return err // nothing committed: the cache stays as it is
	}
	for _, man := range b.Put {
		m.committed[man.ID] = man.Slots
	}
	for _, id := range b.Delete {
		delete(m.committed, id)
	}
	return nil
}

// pruneSlots deletes the keys of bk (4-byte big-endian slots) that keep
// does not name, and any key of another length.
func pruneSlots(bk *bolt.Bucket, keep map[int32]bool) error {
	var stale [][]byte
	err := bk.ForEach(func(k, _ []byte) error {
		if len(k) != 4 || !keep[int32(binary.BigEndian.Uint32(k))] {
			stale = append(stale, bytes.Clone(k))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range stale {
		if err := bk.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
