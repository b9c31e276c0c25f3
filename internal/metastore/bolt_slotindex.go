package metastore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/questrt/questrt/pagestore/tier"
)

// The bbolt slot index, one file (a disk tier's index.db):
//
//	meta/format   the SlotFormat (JSON, "version" first)
//	slots/<slot>  a used slot's entry (8-byte big-endian slot): format
//	              byte, three zero bytes, payload length and CRC,
//	              both u32 LE
//
// Names, keys and encodings are those of the files written before this
// package existed (worker/testdata/table-v1 holds two).
var (
	bkIdxMeta   = []byte("meta")
	bkIdxSlots  = []byte("slots")
	kIdxFormat  = []byte("format")
	slotEntryV1 = byte(1)
)

const (
	slotFormatVersion = 1
	slotEntryBytes    = 12
)

// slotFormatRecord is the format record as encoded: its version first.
type slotFormatRecord struct {
	Version int `json:"version"`
	SlotFormat
}

// boltSlotIndex is a SlotIndex in a bbolt file.
type boltSlotIndex struct {
	boltFile
	payloadBytes atomic.Int64 // Init's format's, for the entries
}

// OpenBoltSlotIndex opens the bbolt slot index at path, creating the
// file (mode 0600); its errors are OpenBolt's.
func OpenBoltSlotIndex(path string, opt Options) (SlotIndex, error) {
	db, err := openChecked(path, opt, bolt.FreelistMapType)
	if err != nil {
		return nil, err
	}
	return &boltSlotIndex{boltFile: boltFile{db: db, readOnly: opt.ReadOnly}}, nil
}

func slotIndexKey(slot int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(slot)) }

// encodeSlotEntry is the value of a used entry.
func encodeSlotEntry(e SlotEntry, payloadBytes int) []byte {
	v := make([]byte, slotEntryBytes)
	v[0] = slotEntryV1
	binary.LittleEndian.PutUint32(v[4:], uint32(payloadBytes))
	binary.LittleEndian.PutUint32(v[8:], e.CRC)
	return v
}

// decodeSlotEntry parses a stored value.
func decodeSlotEntry(v []byte, payloadBytes int) (SlotEntry, error) {
	if len(v) != slotEntryBytes || v[0] != slotEntryV1 {
		first := -1
		if len(v) > 0 {
			first = int(v[0])
		}
		return SlotEntry{}, fmt.Errorf("index value of %d bytes, version %d: %w", len(v), first, tier.ErrCorrupt)
	}
	if n := binary.LittleEndian.Uint32(v[4:]); int64(n) != int64(payloadBytes) {
		return SlotEntry{}, fmt.Errorf("index says %d payload bytes, directory has %d: %w", n, payloadBytes, tier.ErrCorrupt)
	}
	return SlotEntry{Used: true, CRC: binary.LittleEndian.Uint32(v[8:])}, nil
}

// mismatchError is Init's error for another geometry: its message is
// the caller's to end (disktier adds its ErrMismatch).
type mismatchError struct{ msg string }

func (e *mismatchError) Error() string        { return e.msg }
func (e *mismatchError) Is(target error) bool { return target == ErrOtherFormat }

// checkSlotFormat returns the error of a directory of format have
// opened with want (nil when they agree, Slots aside).
func checkSlotFormat(have, want slotFormatRecord) error {
	cmp := have
	cmp.Slots = want.Slots
	if cmp == want {
		return nil
	}
	return &mismatchError{fmt.Sprintf("directory has format version %d, %d-byte payloads, slot alignment %d, %d slots per file; config asks %d, %d, %d, %d",
		have.Version, have.PayloadBytes, have.SlotAlign, have.SlotsPerFile,
		want.Version, want.PayloadBytes, want.SlotAlign, want.SlotsPerFile)}
}

func (x *boltSlotIndex) Init(ctx context.Context, f SlotFormat) ([]SlotEntry, error) {
	want := slotFormatRecord{Version: slotFormatVersion, SlotFormat: f}
	entries := make([]SlotEntry, f.Slots)
	err := x.update(ctx, func(tx *bolt.Tx) error {
		mb, err := tx.CreateBucketIfNotExists(bkIdxMeta)
		if err != nil {
			return err
		}
		sb, err := tx.CreateBucketIfNotExists(bkIdxSlots)
		if err != nil {
			return err
		}
		if v := mb.Get(kIdxFormat); v != nil {
			var have slotFormatRecord
			if err := json.Unmarshal(v, &have); err != nil {
				return fmt.Errorf("format record %q: %v: %w", v, err, tier.ErrCorrupt)
			}
			if err := checkSlotFormat(have, want); err != nil {
				return err
			}
		}
		err = sb.ForEach(func(k, v []byte) error {
			if len(k) != 8 {
				return fmt.Errorf("index key %x is not 8 bytes: %w", k, tier.ErrCorrupt)
			}
			s := binary.BigEndian.Uint64(k)
			if s >= uint64(f.Slots) {
				return &mismatchError{fmt.Sprintf("slot %d holds a payload but config has %d slots", s, f.Slots)}
			}
			e, err := decodeSlotEntry(v, f.PayloadBytes)
			if err != nil {
				return fmt.Errorf("slot %d: %w", s, err)
			}
			entries[s] = e
			return nil
		})
		if err != nil {
			return err
		}
		v, err := json.Marshal(want)
		if err != nil {
			return err
		}
		return mb.Put(kIdxFormat, v)
	})
	if err != nil {
		if errors.Is(err, tier.ErrCorrupt) {
			err = corrupt(err)
		}
		return nil, err
	}
	x.payloadBytes.Store(int64(f.PayloadBytes))
	return entries, nil
}

func (x *boltSlotIndex) Commit(ctx context.Context, changes map[int]SlotEntry) error {
	payloadBytes := int(x.payloadBytes.Load())
	return x.update(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bkIdxSlots)
		if b == nil {
			return fmt.Errorf("metastore: commit a slot index before Init")
		}
		for s, e := range changes {
			var err error
			if e.Used {
				err = b.Put(slotIndexKey(s), encodeSlotEntry(e, payloadBytes))
			} else {
				err = b.Delete(slotIndexKey(s))
			}
			if err != nil {
				return fmt.Errorf("slot %d: %w", s, err)
			}
		}
		return nil
	})
}
