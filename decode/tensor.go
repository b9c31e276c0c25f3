package decode

import "fmt"

// DeviceKind is the kind of memory a Tensor lives in.
type DeviceKind uint8

// Kinds of memory.
const (
	// HostMemory is the process's memory (the zero value).
	HostMemory DeviceKind = iota
	// CUDA is the memory of a CUDA device.
	CUDA
)

// Device names the memory a tensor lives in: the host, or a device of a
// kind with its ordinal.
type Device struct {
	Kind    DeviceKind
	Ordinal int
}

// String is "host" or "cuda:N".
func (d Device) String() string {
	switch d.Kind {
	case HostMemory:
		return "host"
	case CUDA:
		return fmt.Sprintf("cuda:%d", d.Ordinal)
	}
	return fmt.Sprintf("device(%d):%d", d.Kind, d.Ordinal)
}

// Tensor is a view of float32 elements in host memory (Data) or in a
// device's memory (Ptr, Len), in the layout the call documents. A device
// view is ordered on Stream: a runner that reads it queues its work after
// what the caller queued there, and writes an output tensor in the same
// order, so that the caller needs no host synchronisation between layers.
// Tensors are views: the memory belongs to the caller.
type Tensor struct {
	// Device is where the elements live (the zero value: host memory).
	Device Device
	// Data holds the elements of a host tensor.
	Data []float32
	// Ptr is the device address of a device tensor's first element, Len
	// its element count.
	Ptr uintptr
	Len int
	// Stream is the device stream (a CUstream) a device tensor is ordered
	// on; 0 is the device's default stream.
	Stream uintptr
}

// Host returns a host tensor over s.
func Host(s []float32) Tensor { return Tensor{Data: s, Len: len(s)} }

// OnHost reports whether the tensor lives in host memory.
func (t Tensor) OnHost() bool { return t.Device.Kind == HostMemory }

// Elems returns the tensor's element count.
func (t Tensor) Elems() int {
	if t.OnHost() {
		return len(t.Data)
	}
	return t.Len
}

// Zero reports whether the tensor is the zero value (no elements, no
// device memory).
func (t Tensor) Zero() bool { return t.OnHost() && t.Data == nil && t.Ptr == 0 }

// HostData returns the elements of a host tensor; what names the tensor
// in the error of a device one (ErrDeviceTensor).
func (t Tensor) HostData(what string) ([]float32, error) {
	if !t.OnHost() {
		return nil, fmt.Errorf("%w: %s is on %v", ErrDeviceTensor, what, t.Device)
	}
	return t.Data, nil
}

// HostInputs returns the host data of a layer's q, k and v, or
// ErrDeviceTensor naming the first that is on a device.
func HostInputs(q, k, v Tensor) (qd, kd, vd []float32, err error) {
	if qd, err = q.HostData("q"); err != nil {
		return nil, nil, nil, err
	}
	if kd, err = k.HostData("k"); err != nil {
		return nil, nil, nil, err
	}
	if vd, err = v.HostData("v"); err != nil {
		return nil, nil, nil, err
	}
	return qd, kd, vd, nil
}

// OnDevice returns a view of n float32 elements at ptr in the memory of
// dev, ordered on stream.
func OnDevice(dev Device, ptr uintptr, n int, stream uintptr) Tensor {
	return Tensor{Device: dev, Ptr: ptr, Len: n, Stream: stream}
}

// Slice returns the view of elements [off, off+n) of t, on the same
// device and stream. It panics when the range is outside t, as slicing
// does.
func (t Tensor) Slice(off, n int) Tensor {
	if off < 0 || n < 0 || off+n > t.Elems() {
		panic(fmt.Sprintf("decode: slice [%d:%d] of a tensor of %d elements", off, off+n, t.Elems()))
	}
	if t.OnHost() {
		return Host(t.Data[off : off+n])
	}
	t.Ptr += uintptr(off) * 4
	t.Len = n
	return t
}
