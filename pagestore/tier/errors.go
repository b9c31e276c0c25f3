package tier

import (
	"context"
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by tiers wrap them with the operation,
// the slot and, for files, the path; test with errors.Is.
var (
	// ErrEmpty: the slot holds no payload (never written, or freed).
	// Returned by Read and Free of an empty slot, and by
	// [Allocator.Release] of a slot that is not allocated.
	ErrEmpty = errors.New("tier: slot is empty")
	// ErrCorrupt: the stored payload does not match its checksum or length
	// (or its file is missing or short). No bytes of it are returned.
	ErrCorrupt = errors.New("tier: payload corrupt")
	// ErrClosed: the tier is closed.
	ErrClosed = errors.New("tier: closed")
	// ErrSlot: a slot outside [0, Slots()).
	ErrSlot = errors.New("tier: slot out of range")
	// ErrSize: a payload or destination buffer whose length is not
	// PayloadBytes(), or a size that is not positive.
	ErrSize = errors.New("tier: wrong payload size")
	// ErrFull: [Allocator.Alloc] found no free slot.
	ErrFull = errors.New("tier: no free slot")
	// ErrInjected: a fault injected by [Faulty].
	ErrInjected = errors.New("tier: injected fault")
)

// CheckSlot returns nil when 0 <= slot < slots, else an error wrapping
// [ErrSlot]. It is for implementations, so that every tier reports bad
// arguments alike.
func CheckSlot(slot, slots int) error {
	if slot < 0 || slot >= slots {
		return fmt.Errorf("slot %d not in [0, %d): %w", slot, slots, ErrSlot)
	}
	return nil
}

// CheckSize returns nil when n == payloadBytes, else an error wrapping
// [ErrSize] (for implementations, like [CheckSlot]).
func CheckSize(n, payloadBytes int) error {
	if n != payloadBytes {
		return fmt.Errorf("%d bytes, payload is %d: %w", n, payloadBytes, ErrSize)
	}
	return nil
}

// CheckContext returns nil when ctx is not done, else an error wrapping
// ctx.Err() (for implementations, like [CheckSlot]).
func CheckContext(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("context done: %w", err)
	}
	return nil
}
