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
//	select:            rows u32 | khash u64 | rows x (count u32 | count x (score f32 | page i32))
//	reduce, allreduce: n u32 | d u32 | n*d x o f32 | n x lse f32
//	abort:             reason (UTF-8 text, at most maxReason bytes)
const (
	kindData  = 0
	kindAbort = 1
	version   = 1

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

func getCandidate(b []byte, i int) Candidate {
	off := i * candidateLen
	return Candidate{
		Score: math.Float32frombits(binary.LittleEndian.Uint32(b[off:])),
		Page:  int32(binary.LittleEndian.Uint32(b[off+4:])),
	}
}

// sortKey maps a candidate (score not NaN, page >= 0) to a key whose
// ascending order is Compare's order: the high 32 bits are the score made
// order-preserving and inverted (score descending; -0 folds into +0, as
// the two compare equal), the low 32 bits the page (ascending).
func sortKey(c Candidate) uint64 {
	s := c.Score
	if s == 0 {
		s = 0 // -0 -> +0
	}
	b := math.Float32bits(s)
	if b&(1<<31) != 0 {
		b = ^b
	} else {
		b |= 1 << 31
	}
	return uint64(^b)<<32 | uint64(uint32(c.Page))
}

// noKey ends a row's keys: it sorts after every valid key (its score part
// would be a NaN, which is never accepted).
const noKey = ^uint64(0)

// fromKey inverts sortKey (up to the sign of a zero score).
func fromKey(k uint64) Candidate {
	b := ^uint32(k >> 32)
	if b&(1<<31) != 0 {
		b &^= 1 << 31
	} else {
		b = ^b
	}
	return Candidate{Score: math.Float32frombits(b), Page: int32(uint32(k))}
}

func putCandidate(b []byte, c Candidate) {
	binary.LittleEndian.PutUint32(b, math.Float32bits(c.Score))
	binary.LittleEndian.PutUint32(b[4:], uint32(c.Page))
}

// hashBudgets is FNV-1a over the budgets, so ranks detect disagreeing k.
func hashBudgets(k []int) uint64 {
	h := uint64(14695981039346656037)
	var b [8]byte
	for _, x := range k {
		binary.LittleEndian.PutUint64(b[:], uint64(x))
		for _, c := range b {
			h ^= uint64(c)
			h *= 1099511628211
		}
	}
	return h
}
