package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
)

// NodeMeta is what a node advertises about itself in gossip: enough for
// placement to choose nodes and for a client to reach them. It travels in
// every alive message, so it is small and stays under memberlist's
// 512-byte limit ([memberlist.MetaMaxSize]); the full device inventory is
// served over gRPC instead.
type NodeMeta struct {
	// GRPCAddr is the host:port of the node's gRPC server. Empty while the
	// node does not serve yet.
	GRPCAddr string
	// Version is the questrt version the node runs (for example "v0.3.0"
	// or a commit).
	Version string
	// Backend is the kernel backend: "cpu" or "cuda" (lower-case letters,
	// digits, '-' and '_'; at most 16 bytes). Empty means unknown.
	Backend string
	// Devices is the number of compute devices: GPUs, or 1 for the CPU.
	Devices uint32
	// FreePages and TotalPages are the page capacity summed over the
	// node's devices; FreePages <= TotalPages.
	FreePages  uint64
	TotalPages uint64
	// FreeBytes is the free device memory summed over the node's devices.
	FreeBytes uint64
	// Transport is how the node's gRPC server is secured: what a peer
	// needs to reach it, declared so that a node of the other kind is
	// refused without a dial (a plaintext member of a TLS cluster).
	// TransportUnknown from a node older than the field.
	Transport Transport
}

// Transport is the security of a node's gRPC server, as its gossip
// metadata declares it.
type Transport uint8

const (
	// TransportUnknown is a node that does not say (metadata version 1).
	TransportUnknown Transport = iota
	// TransportPlaintext is a node serving gRPC without TLS (--insecure).
	TransportPlaintext
	// TransportTLS is a node serving gRPC under mutual TLS.
	TransportTLS
)

// String is "unknown", "plaintext" or "tls".
func (t Transport) String() string {
	switch t {
	case TransportUnknown:
		return "unknown"
	case TransportPlaintext:
		return "plaintext"
	case TransportTLS:
		return "tls"
	}
	return fmt.Sprintf("Transport(%d)", uint8(t))
}

// ErrMetaTooLarge means the encoded node metadata does not fit
// memberlist's limit of [memberlist.MetaMaxSize] bytes: shorten its
// strings.
var ErrMetaTooLarge = errors.New("node meta too large")

// ErrInvalidMeta means node metadata is malformed: a field breaks its
// rule, or received bytes do not decode.
var ErrInvalidMeta = errors.New("invalid node meta")

// The wire format of node metadata, version 2:
//
//	magic 'q', version byte
//	uvarint instance (the sender's per-process random id)
//	string GRPCAddr, string Version, string Backend (uvarint length, bytes)
//	uvarint Devices, uvarint FreePages, uvarint TotalPages, uvarint FreeBytes
//	uvarint Transport (since version 2; version 1 ends before it)
//
// Versions are append-only: a later version adds fields at the end, and a
// decoder reads the fields it knows and ignores the rest. Versions 1 and
// 2 themselves allow no trailing bytes.
const (
	metaMagic   = 'q'
	metaVersion = 2
	// maxMetaString bounds each string field of [NodeMeta].
	maxMetaString = 255
	maxBackendLen = 16
	maxDevices    = 1 << 16
)

// Validate checks each field's rule and that the encoded form fits
// [memberlist.MetaMaxSize] (reporting [ErrMetaTooLarge]).
func (m NodeMeta) Validate() error {
	if err := m.validate(); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}

func (m NodeMeta) validate() error {
	if err := m.validateFields(); err != nil {
		return err
	}
	// The instance id is a varint: take its largest encoding.
	if n := len(appendNodeMeta(nil, math.MaxUint64, m)); n > memberlist.MetaMaxSize {
		return fmt.Errorf("%w: %d bytes encoded, limit %d", ErrMetaTooLarge, n, memberlist.MetaMaxSize)
	}
	return nil
}

func (m NodeMeta) validateFields() error {
	for _, f := range []struct{ name, v string }{
		{"grpc address", m.GRPCAddr}, {"version", m.Version}, {"backend", m.Backend},
	} {
		if len(f.v) > maxMetaString {
			return fmt.Errorf("%w: %s is %d bytes, limit %d", ErrMetaTooLarge, f.name, len(f.v), maxMetaString)
		}
		if !printable(f.v) {
			return fmt.Errorf("%w: %s %q has non-printable or non-UTF-8 characters", ErrInvalidMeta, f.name, f.v)
		}
	}
	if m.GRPCAddr != "" {
		host, port, err := net.SplitHostPort(m.GRPCAddr)
		if err != nil {
			return fmt.Errorf("%w: grpc address %q: %v", ErrInvalidMeta, m.GRPCAddr, err)
		}
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return fmt.Errorf("%w: grpc address %q: port must be 1-65535", ErrInvalidMeta, m.GRPCAddr)
		}
		if host == "" {
			return fmt.Errorf("%w: grpc address %q: empty host", ErrInvalidMeta, m.GRPCAddr)
		}
	}
	if len(m.Backend) > maxBackendLen {
		return fmt.Errorf("%w: backend %q longer than %d bytes", ErrInvalidMeta, m.Backend, maxBackendLen)
	}
	for _, c := range []byte(m.Backend) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("%w: backend %q: only a-z, 0-9, '-' and '_'", ErrInvalidMeta, m.Backend)
		}
	}
	if m.Devices > maxDevices {
		return fmt.Errorf("%w: %d devices, limit %d", ErrInvalidMeta, m.Devices, maxDevices)
	}
	if m.FreePages > m.TotalPages {
		return fmt.Errorf("%w: free pages %d > total pages %d", ErrInvalidMeta, m.FreePages, m.TotalPages)
	}
	if m.Transport > TransportTLS {
		return fmt.Errorf("%w: transport %d (want 0 unknown, 1 plaintext or 2 tls)", ErrInvalidMeta, m.Transport)
	}
	return nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// encodeNodeMeta validates m and encodes it with the sender's instance id.
func encodeNodeMeta(instance uint64, m NodeMeta) ([]byte, error) {
	if err := m.validateFields(); err != nil {
		return nil, err
	}
	b := appendNodeMeta(make([]byte, 0, 96), instance, m)
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("%w: %d bytes encoded, limit %d", ErrMetaTooLarge, len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

func appendNodeMeta(b []byte, instance uint64, m NodeMeta) []byte {
	b = append(b, metaMagic, metaVersion)
	b = binary.AppendUvarint(b, instance)
	b = appendString(b, m.GRPCAddr)
	b = appendString(b, m.Version)
	b = appendString(b, m.Backend)
	b = binary.AppendUvarint(b, uint64(m.Devices))
	b = binary.AppendUvarint(b, m.FreePages)
	b = binary.AppendUvarint(b, m.TotalPages)
	b = binary.AppendUvarint(b, m.FreeBytes)
	b = binary.AppendUvarint(b, uint64(m.Transport))
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeNodeMeta decodes and validates metadata received from a peer. It
// never panics on any input (FuzzDecodeNodeMeta).
func decodeNodeMeta(b []byte) (instance uint64, m NodeMeta, err error) {
	if len(b) > memberlist.MetaMaxSize {
		return 0, NodeMeta{}, fmt.Errorf("%w: %d bytes, limit %d", ErrMetaTooLarge, len(b), memberlist.MetaMaxSize)
	}
	if len(b) < 2 || b[0] != metaMagic {
		return 0, NodeMeta{}, fmt.Errorf("%w: not questrt node meta (%d bytes)", ErrInvalidMeta, len(b))
	}
	if b[1] == 0 {
		return 0, NodeMeta{}, fmt.Errorf("%w: version 0", ErrInvalidMeta)
	}
	r := reader{b: b[2:]}
	instance = r.uvarint("instance")
	m.GRPCAddr = r.string("grpc address", maxMetaString)
	m.Version = r.string("version", maxMetaString)
	m.Backend = r.string("backend", maxMetaString)
	devices := r.uvarint("devices")
	m.FreePages = r.uvarint("free pages")
	m.TotalPages = r.uvarint("total pages")
	m.FreeBytes = r.uvarint("free bytes")
	var transport uint64
	if b[1] >= 2 {
		transport = r.uvarint("transport")
	}
	if r.err != nil {
		return 0, NodeMeta{}, fmt.Errorf("%w: %v", ErrInvalidMeta, r.err)
	}
	if b[1] <= metaVersion && len(r.b) > 0 {
		return 0, NodeMeta{}, fmt.Errorf("%w: %d trailing bytes", ErrInvalidMeta, len(r.b))
	}
	if devices > maxDevices {
		return 0, NodeMeta{}, fmt.Errorf("%w: %d devices, limit %d", ErrInvalidMeta, devices, maxDevices)
	}
	m.Devices = uint32(devices)
	if transport > uint64(TransportTLS) {
		return 0, NodeMeta{}, fmt.Errorf("%w: transport %d (want 0 unknown, 1 plaintext or 2 tls)", ErrInvalidMeta, transport)
	}
	m.Transport = Transport(transport)
	if err := m.validateFields(); err != nil {
		return 0, NodeMeta{}, err
	}
	return instance, m, nil
}

// reader decodes varints and length-prefixed strings, keeping the first
// error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint(field string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%s: bad varint", field)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) string(field string, limit int) string {
	n := r.uvarint(field + " length")
	if r.err != nil {
		return ""
	}
	if n > uint64(limit) || n > uint64(len(r.b)) {
		r.err = fmt.Errorf("%s: length %d (limit %d, %d bytes left)", field, n, limit, len(r.b))
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}
