package disktier

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/questrt/questrt/internal/boltcheck"
	"github.com/questrt/questrt/pagestore/tier"
)

// The bbolt layout (see the package documentation).
var (
	bucketMeta  = []byte("meta")
	bucketSlots = []byte("slots")
	keyFormat   = []byte("format")
)

const (
	formatVersion = 1
	entryVersion  = 1
	entryBytes    = 12
)

// format is the directory's fixed geometry, stored as JSON under
// meta/format.
type format struct {
	Version      int   `json:"version"`
	PayloadBytes int   `json:"payload_bytes"`
	SlotAlign    int   `json:"slot_align"`
	SlotsPerFile int   `json:"slots_per_file"`
	SlotBytes    int64 `json:"slot_bytes"`
	Slots        int   `json:"slots"` // the count of the last Open (informational)
}

func formatOf(c Config) format {
	return format{
		Version:      formatVersion,
		PayloadBytes: c.PayloadBytes,
		SlotAlign:    c.SlotAlign,
		SlotsPerFile: c.SlotsPerFile,
		SlotBytes:    c.SlotBytes(),
		Slots:        c.Slots,
	}
}

// castagnoli is the CRC32C table (read-only after package init).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum is the CRC32C of slot (8 bytes little-endian) then payload.
func checksum(slot int, payload []byte) uint32 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(slot))
	return crc32.Update(crc32.Update(0, castagnoli, b[:]), castagnoli, payload)
}

func slotKey(slot int) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], uint64(slot))
	return k[:]
}

// entry is one slot's index record: used slots only are stored.
type entry struct {
	used bool
	crc  uint32
}

// encode returns the 12-byte value of a used entry: format byte, three
// zero bytes, payload length and CRC32C, both little-endian.
func (e entry) encode(payloadBytes int) []byte {
	v := make([]byte, entryBytes)
	v[0] = entryVersion
	binary.LittleEndian.PutUint32(v[4:], uint32(payloadBytes))
	binary.LittleEndian.PutUint32(v[8:], e.crc)
	return v
}

// decodeEntry parses a stored value.
func decodeEntry(v []byte, payloadBytes int) (entry, error) {
	if len(v) != entryBytes || v[0] != entryVersion {
		return entry{}, fmt.Errorf("index value of %d bytes, version %d: %w", len(v), first(v), tier.ErrCorrupt)
	}
	if n := binary.LittleEndian.Uint32(v[4:]); int64(n) != int64(payloadBytes) {
		return entry{}, fmt.Errorf("index says %d payload bytes, directory has %d: %w", n, payloadBytes, tier.ErrCorrupt)
	}
	return entry{used: true, crc: binary.LittleEndian.Uint32(v[8:])}, nil
}

func first(v []byte) int {
	if len(v) == 0 {
		return -1
	}
	return int(v[0])
}

// initIndex creates the buckets and the format of a new directory, or
// checks an existing directory's format against c, and returns the entries
// of all c.Slots slots. It runs in one transaction: on error nothing
// changes.
func initIndex(db *bolt.DB, c Config, path string) ([]entry, error) {
	want := formatOf(c)
	entries := make([]entry, c.Slots)
	err := boltcheck.Update(db, func(tx *bolt.Tx) error {
		mb, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		sb, err := tx.CreateBucketIfNotExists(bucketSlots)
		if err != nil {
			return err
		}
		if v := mb.Get(keyFormat); v != nil {
			var have format
			if err := json.Unmarshal(v, &have); err != nil {
				return fmt.Errorf("format record %q: %v: %w", v, err, tier.ErrCorrupt)
			}
			cmp := have
			cmp.Slots = want.Slots
			if cmp != want {
				return fmt.Errorf("directory has format version %d, %d-byte payloads, slot alignment %d, %d slots per file; config asks %d, %d, %d, %d: %w",
					have.Version, have.PayloadBytes, have.SlotAlign, have.SlotsPerFile,
					want.Version, want.PayloadBytes, want.SlotAlign, want.SlotsPerFile, ErrMismatch)
			}
		}
		err = sb.ForEach(func(k, v []byte) error {
			if len(k) != 8 {
				return fmt.Errorf("index key %x is not 8 bytes: %w", k, tier.ErrCorrupt)
			}
			s := binary.BigEndian.Uint64(k)
			if s >= uint64(c.Slots) {
				return fmt.Errorf("slot %d holds a payload but config has %d slots: %w", s, c.Slots, ErrMismatch)
			}
			e, err := decodeEntry(v, c.PayloadBytes)
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
		return mb.Put(keyFormat, v)
	})
	if err != nil {
		return nil, fmt.Errorf("index %s: %w", path, err)
	}
	return entries, nil
}

// commit applies changes (slot -> entry: put when used, else delete) to the index in one transaction.
func commit(db *bolt.DB, changes map[int]entry, payloadBytes int) error {
	return boltcheck.Update(db, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSlots)
		for s, e := range changes {
			var err error
			if e.used {
				err = b.Put(slotKey(s), e.encode(payloadBytes))
			} else {
				err = b.Delete(slotKey(s))
			}
			if err != nil {
				return fmt.Errorf("slot %d: %w", s, err)
			}
		}
		return nil
	})
}

func isLockTimeout(err error) bool { return errors.Is(err, berrors.ErrTimeout) }

// isInvalidIndex reports whether bbolt found index.db unreadable.
func isInvalidIndex(err error) bool {
	return errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrChecksum) || errors.Is(err, berrors.ErrVersionMismatch)
}
