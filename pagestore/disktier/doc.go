// Package disktier is the disk tier of the page store: a tier.Tier that
// keeps page payloads in fixed-slot slab files and only its index in bbolt
// (go.etcd.io/bbolt, through internal/metastore's SlotIndex), as DESIGN.md
// section 5 asks: large values fragment bbolt, and long read transactions
// block its remapping.
//
// # Layout of a directory
//
//	DIR/index.db        bbolt: bucket "meta" (the format: payload size,
//	                    slot alignment, slots per file, slot count) and
//	                    bucket "slots" (one 12-byte value per written slot)
//	DIR/slab-000000     slots 0 .. SlotsPerFile-1
//	DIR/slab-000001     slots SlotsPerFile .. 2*SlotsPerFile-1, ...
//
// Slot s lives in file s / SlotsPerFile at offset
// (s % SlotsPerFile) x SlotBytes, where SlotBytes is PayloadBytes rounded up
// to SlotAlign. A slab file is created when one of its slots is first
// written, at its full size (sparse, or reserved with fallocate when
// Config.Preallocate is set); files are never shrunk.
//
// The index holds, per written slot (key: the slot, 8 bytes big-endian), a
// format byte, the payload length and a CRC32C (Castagnoli) of the slot
// number (8 bytes little-endian) followed by the payload; a payload found at
// the wrong slot therefore fails its check too. A free slot has no key. The
// whole index is loaded into memory at [Open], so Read never opens a bbolt
// transaction; bbolt is written by Write and Free (SyncOnWrite) or by the
// flusher (SyncPeriodic, SyncNone).
//
// Read verifies length and checksum and returns tier.ErrCorrupt, wrapped
// with the slot and the slab file, on a mismatch, a missing or short slab
// file; dst is then zeroed, never filled with the bad bytes. Free only drops
// the index entry: the slab bytes stay until the slot is written again, and
// a freed slot reads tier.ErrEmpty, before and after a reopen.
//
// # Durability
//
// [Config.Durability] chooses when writes become durable:
//
//   - SyncOnWrite (the default): Write writes the slab, fdatasyncs it, then
//     commits the index entry (a bbolt transaction, which fsyncs) before it
//     returns; Free commits the deletion before it returns. A crash loses
//     no Write or Free that returned. A Write in flight at the crash leaves
//     its slot empty (a slot that was empty), with the new payload, or —
//     when it overwrote a payload — reading tier.ErrCorrupt (the old index
//     entry no longer matches the slab): the old payload can be lost, wrong
//     bytes are never returned. A Free in flight leaves the slot freed or
//     still holding its payload.
//   - SyncPeriodic: Write and Free change the in-memory index and queue the
//     index update; every Config.SyncInterval a flusher fdatasyncs the slab
//     files written since the last flush and then commits the queued
//     updates in one bbolt transaction. [Tier.Sync] and Close flush too.
//   - SyncNone: as SyncPeriodic without the timer: only Sync and Close
//     flush.
//
// With SyncPeriodic and SyncNone a crash returns the index to the last
// completed flush: Writes and Frees after it are lost. A slot written
// after it reads as it did at that flush (empty, or its payload then) if
// its new bytes did not reach the disk, or tier.ErrCorrupt if they did and
// the flushed entry was for other bytes; a freed slot reads its old
// payload again. In every mode, wrong bytes are never returned without an
// error (up to CRC32C's detection rate) and a clean Close loses nothing.
//
// # Locking
//
// Open takes bbolt's exclusive file lock on index.db with
// Config.LockTimeout, so a directory open in this or another process is
// refused quickly with an error wrapping [ErrInUse]. The lock is released by
// Close (or by the process's exit).
//
// # Concurrency
//
// A Tier meets tier.Tier's contract: safe for concurrent use; calls on
// distinct slots run in parallel (slab I/O is positioned, and each slot's
// index entry is guarded by one of 256 striped locks, so slots 256 apart
// share a lock); calls on one slot are linearizable. With SyncOnWrite the
// index commits of concurrent Writes and Frees serialize in bbolt (one
// transaction and its fsyncs each).
package disktier
