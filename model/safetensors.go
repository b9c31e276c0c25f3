package model

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MaxHeaderBytes bounds a safetensors JSON header (the format's own limit
// is 100 MB); larger headers are refused before they are read.
const MaxHeaderBytes = 100 << 20

// DType is a safetensors element type.
type DType string

// The element types this package converts to float32. Other safetensors
// types (integers, F64, FP8) parse but are refused by [File.Float32].
const (
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
)

// dtypeSizes are the element sizes of every dtype the format defines.
var dtypeSizes = map[DType]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
	"I16": 2, "U16": 2, F16: 2, BF16: 2,
	"I32": 4, "U32": 4, F32: 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// Size returns the bytes of one element, or 0 for an unknown type.
func (d DType) Size() int { return dtypeSizes[d] }

// TensorInfo is one entry of a safetensors header. Offsets are relative to
// the start of the data section (after the header).
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int
	Begin int64
	End   int64
}

// Elements is the product of Shape (1 for a scalar).
func (t TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// Header is a parsed safetensors header.
type Header struct {
	// Tensors in file order (ascending Begin).
	Tensors []TensorInfo
	// Metadata is the optional "__metadata__" string map.
	Metadata map[string]string
	// DataStart is the file offset of the data section: 8 + header length.
	DataStart int64
}

// Tensor returns the named tensor's entry.
func (h *Header) Tensor(name string) (TensorInfo, bool) {
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// ErrFormat marks a malformed or truncated safetensors file.
var ErrFormat = errors.New("safetensors: bad format")

// ParseHeader parses the header at the start of a safetensors file whose
// total size is fileSize bytes: b holds at least the 8-byte length prefix
// and, when the prefix fits, the JSON header after it. It checks every
// tensor's dtype, shape and byte range against the data section (a file
// shorter than its header says is reported as truncated), and that no two
// tensors overlap.
func ParseHeader(b []byte, fileSize int64) (*Header, error) {
	if len(b) < 8 || fileSize < 8 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the 8-byte header length (truncated)", ErrFormat, min(int64(len(b)), fileSize))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > MaxHeaderBytes {
		return nil, fmt.Errorf("%w: header length %d exceeds the %d-byte limit", ErrFormat, n, MaxHeaderBytes)
	}
	if int64(n) > fileSize-8 {
		return nil, fmt.Errorf("%w: header length %d but the file has %d bytes after the length (truncated)", ErrFormat, n, fileSize-8)
	}
	if uint64(len(b)-8) < n {
		return nil, fmt.Errorf("%w: header length %d but only %d header bytes given", ErrFormat, n, len(b)-8)
	}
	raw := b[8 : 8+n]
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("%w: header JSON: %v", ErrFormat, err)
	}
	h := &Header{DataStart: 8 + int64(n)}
	dataLen := fileSize - h.DataStart
	for name, msg := range entries {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, fmt.Errorf("%w: __metadata__ is not a string map: %v", ErrFormat, err)
			}
			continue
		}
		var e struct {
			DType   DType    `json:"dtype"`
			Shape   []int64  `json:"shape"`
			Offsets []uint64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrFormat, name, err)
		}
		size := e.DType.Size()
		if size == 0 {
			return nil, fmt.Errorf("%w: tensor %q: unknown dtype %q", ErrFormat, name, e.DType)
		}
		if len(e.Offsets) != 2 || e.Shape == nil {
			return nil, fmt.Errorf("%w: tensor %q: want shape and two data_offsets", ErrFormat, name)
		}
		begin, end := e.Offsets[0], e.Offsets[1]
		if begin > end {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets [%d, %d] are reversed", ErrFormat, name, begin, end)
		}
		elems := uint64(1)
		shape := make([]int, len(e.Shape))
		for i, d := range e.Shape {
			if d < 0 || d > math.MaxInt32 {
				return nil, fmt.Errorf("%w: tensor %q: dimension %d out of range", ErrFormat, name, d)
			}
			shape[i] = int(d)
			hi, lo := bits.Mul64(elems, uint64(d))
			if hi != 0 || lo > math.MaxInt64 {
				return nil, fmt.Errorf("%w: tensor %q: shape %v overflows", ErrFormat, name, e.Shape)
			}
			elems = lo
		}
		hi, want := bits.Mul64(elems, uint64(size))
		if hi != 0 || want != end-begin {
			return nil, fmt.Errorf("%w: tensor %q: shape %v of %s needs %d*%d bytes, data_offsets give %d", ErrFormat, name, e.Shape, e.DType, elems, size, end-begin)
		}
		if end > uint64(dataLen) {
			return nil, fmt.Errorf("%w: tensor %q ends at data byte %d but the file has %d data bytes (truncated)", ErrFormat, name, end, dataLen)
		}
		h.Tensors = append(h.Tensors, TensorInfo{Name: name, DType: e.DType, Shape: shape, Begin: int64(begin), End: int64(end)})
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.Name < b.Name
	})
	for i := 1; i < len(h.Tensors); i++ {
		if a, b := h.Tensors[i-1], h.Tensors[i]; b.Begin < a.End {
			return nil, fmt.Errorf("%w: tensors %q and %q overlap", ErrFormat, a.Name, b.Name)
		}
	}
	return h, nil
}

// File is a safetensors file mapped read-only into memory. Its methods
// are safe for concurrent use until Close.
type File struct {
	Path   string
	Header *Header
	data   []byte // the whole file, mmapped
}

// OpenSafetensors maps path and parses its header.
func OpenSafetensors(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size < 8 {
		return nil, fmt.Errorf("%s: %w: %d bytes, shorter than the 8-byte header length (truncated)", path, ErrFormat, size)
	}
	if size > math.MaxInt {
		return nil, fmt.Errorf("%s: %d bytes do not fit the address space", path, size)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	h, err := ParseHeader(data, size)
	if err != nil {
		unix.Munmap(data)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &File{Path: path, Header: h, data: data}, nil
}

// Close unmaps the file. Slices returned by Raw and aliases returned by
// Float32 become invalid.
func (f *File) Close() error {
	if f.data == nil {
		return nil
	}
	err := unix.Munmap(f.data)
	f.data = nil
	return err
}

// Raw returns a tensor's bytes in place (valid until Close).
func (f *File) Raw(t TensorInfo) []byte {
	off := f.Header.DataStart
	return f.data[off+t.Begin : off+t.End : off+t.End]
}

// Float32 returns the named tensor converted to float32. An F32 tensor
// whose bytes are 4-byte aligned is returned in place, without a copy
// (valid until Close; alias reports it); F16 and BF16 are converted into a
// new slice. Other dtypes are refused.
func (f *File) Float32(t TensorInfo) (v []float32, alias bool, err error) {
	raw := f.Raw(t)
	n := len(raw) / max(t.DType.Size(), 1)
	switch t.DType {
	case F32:
		if n == 0 {
			return []float32{}, false, nil
		}
		if uintptr(unsafe.Pointer(&raw[0]))%4 == 0 && littleEndian {
			return unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), n), true, nil
		}
		v = make([]float32, n)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	case BF16:
		v = make([]float32, n)
		for i := range v {
			v[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(raw[2*i:])) << 16)
		}
	case F16:
		v = make([]float32, n)
		for i := range v {
			v[i] = Float16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	default:
		return nil, false, fmt.Errorf("tensor %q: dtype %s is not a float type this loader converts (want F32, F16 or BF16)", t.Name, t.DType)
	}
	return v, false, nil
}

var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// Float16ToFloat32 converts an IEEE 754 half-precision value exactly.
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf, nan
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: value = mant * 2^-24.
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}
