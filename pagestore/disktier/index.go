package disktier

import (
	"encoding/binary"
	"hash/crc32"

	"github.com/questrt/questrt/internal/metastore"
)

// The index is a metastore.SlotIndex in a bbolt file (see the package
// documentation).

// entry is one slot's index entry: used slots only are stored.
type entry = metastore.SlotEntry

// slotFormatOf is the directory's fixed geometry (and slot count).
func slotFormatOf(c Config) metastore.SlotFormat {
	return metastore.SlotFormat{
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
