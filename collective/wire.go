package collective

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// Wire format. Every message starts with a 4-byte header:
//
//	kind u8 | op u8 | version u8 | reserved u8
//
// kind is data or abort; op is the Op the message belongs to (0 in an
// abort sent by Abort outside an operation). All integers and floats are
// little-endian. After the header:
//
//	gather:            payload bytes
//	select:            rows u32 | khash u64 | total x key u64 | rows x count u32
//	reduce, allreduce: n u32 | d u32 | n*d x o f32 | n x lse f32
//	abort:             reason (UTF-8 text, at most maxReason bytes)
//
// A select frame's candidates travel as their sort keys (sortKey: the
// order-preserving inverted score bits above the page), row after row,
// each row's in strictly ascending order, which is Compare's; the rows'
// counts follow them. So the keys start 16 bytes into the frame, 8-byte
// aligned in any buffer that is, and receivers merge them in place
// (keysView), checking each with a range test (validKey), without
// remapping scores, copying or sorting. khash is hashBudgets of the
// budgets. Version 2 changed hashBudgets (FNV-1a over 64-bit words instead
// of bytes); version 3 sent keys instead of (score f32 | page i32) pairs,
// each row's count before its keys; version 4 moves the counts after all
// the keys (the same bytes): members of one group must run the same
// version.
const (
	kindData  = 0
	kindAbort = 1
	version   = 4

	headerLen       = 4
	selectHeaderLen = headerLen + 4 + 8
	stateHeaderLen  = headerLen + 4 + 4
	candidateLen    = 8
	maxReason       = 256
)

var nativeLittle = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func putHeader(b []byte, kind byte, op Op) {
	b[0], b[1], b[2], b[3] = kind, byte(op), version, 0
}

// grow returns b resized to n bytes, reallocating only when too small.
func growBytes(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n, n+n/4)
	}
	return b[:n]
}

func growF32(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// putF32s writes f as little-endian float32s at the start of b.
func putF32s(b []byte, f []float32) {
	if len(f) == 0 {
		return
	}
	if nativeLittle {
		copy(b, unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f)))
		return
	}
	for i, x := range f {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
}

// getF32s reads len(f) little-endian float32s from the start of b.
func getF32s(f []float32, b []byte) {
	if len(f) == 0 {
		return
	}
	if nativeLittle {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f)), b)
		return
	}
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// sortKey maps a candidate (score not NaN, page >= 0) to a key whose
// ascending order is Compare's order: the high 32 bits are the score made
// order-preserving and inverted (score descending; -0 folds into +0, as
// the two compare equal), the low 32 bits the page (ascending).
func sortKey(c Candidate) uint64 {
	return keyOf(math.Float32bits(c.Score), uint32(c.Page))
}

// keyOf is sortKey of a candidate given as its score's bits and its page.
// It has no data-dependent branch: the sign of random scores is a coin
// flip that a branch would mispredict half the time.
func keyOf(score, page uint32) uint64 {
	// Flip every bit of a negative score and the sign bit of a positive
	// one: the bits then order as the floats do, -0 just below +0.
	t := score ^ (uint32(int32(score)>>31) | 1<<31)
	if t == 1<<31-1 {
		t = 1 << 31 // -0 -> +0 (rare, so predictable)
	}
	return uint64(^t)<<32 | uint64(page)
}

// noKey sorts after every valid key (its score part
// would be a NaN, which is never accepted).
const noKey = ^uint64(0)

// minKey is a lower bound of every valid key: the key of (+Inf, 0), whose
// score part 0x007fffff is the smallest a non-NaN score maps to.
const minKey = uint64(0x007fffff) << 32

// keyScore returns the score bits a key was made from (+0 for a zero).
func keyScore(k uint64) uint32 {
	t := ^uint32(k >> 32)
	return t ^ (uint32(int32(^t)>>31) | 1<<31)
}

// fromKey inverts sortKey (up to the sign of a zero score).
func fromKey(k uint64) Candidate {
	return Candidate{Score: math.Float32frombits(keyScore(k)), Page: int32(uint32(k))}
}

// validKey reports whether k is the sort key of a candidate: a score part
// that a non-NaN score maps to (in [minKey>>32, maxScorePart], but not
// negZeroPart, which no score maps to since -0 folds into +0) and a page
// below 1<<31.
func validKey(k uint64) bool {
	sp := uint32(k >> 32)
	return sp-minScorePart <= maxScorePart-minScorePart && sp != negZeroPart && int32(uint32(k)) >= 0
}

const (
	minScorePart = uint32(minKey >> 32) // +Inf's
	maxScorePart = 0xff800000           // -Inf's
	negZeroPart  = 0x80000000           // what -0 would map to unfolded
)

// hashBudgets is FNV-1a over the budgets taken as 64-bit words (one
// multiply per row), so ranks detect disagreeing k: each step is a
// bijection of the running hash, so budgets that differ in one row always
// hash differently.
func hashBudgets(k []int) uint64 {
	h := uint64(14695981039346656037)
	for _, x := range k {
		h ^= uint64(x)
		h *= 1099511628211
	}
	return h
}
