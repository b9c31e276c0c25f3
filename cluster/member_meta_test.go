package cluster

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/hashicorp/memberlist"
)

func sampleMeta() NodeMeta {
	return NodeMeta{
		GRPCAddr:   "10.0.0.7:7070",
		Version:    "v0.3.0-12-gabcdef",
		Backend:    "cuda",
		Devices:    8,
		Transport:  TransportTLS,
		FreePages:  1 << 20,
		TotalPages: 1 << 21,
		FreeBytes:  80 << 30,
	}
}

// TestNodeMetaRoundTrip: encode then decode gives the same meta and
// instance, and a full-sized realistic meta stays far below the limit.
func TestNodeMetaRoundTrip(t *testing.T) {
	for _, m := range []NodeMeta{{}, sampleMeta(), {GRPCAddr: "[::1]:1", Backend: "cpu", Devices: 1}} {
		for _, inst := range []uint64{0, 1, math.MaxUint64} {
			b, err := encodeNodeMeta(inst, m)
			if err != nil {
				t.Fatalf("encode %+v: %v", m, err)
			}
			gotInst, got, err := decodeNodeMeta(b)
			if err != nil || got != m || gotInst != inst {
				t.Errorf("round trip of %+v/%d: %+v/%d, %v", m, inst, got, gotInst, err)
			}
		}
	}
	b, _ := encodeNodeMeta(math.MaxUint64, sampleMeta())
	t.Logf("sample meta: %d bytes of %d", len(b), memberlist.MetaMaxSize)
	if len(b) > 100 {
		t.Errorf("sample meta is %d bytes", len(b))
	}
}

// TestNodeMetaLimits: meta that cannot fit 512 bytes is ErrMetaTooLarge,
// broken fields ErrInvalidMeta.
func TestNodeMetaLimits(t *testing.T) {
	big := sampleMeta()
	big.Version = strings.Repeat("v", 255)
	big.GRPCAddr = strings.Repeat("h", 240) + ":7070"
	if err := big.Validate(); !errors.Is(err, ErrMetaTooLarge) {
		t.Errorf("%d+%d-byte strings: %v, want ErrMetaTooLarge", len(big.Version), len(big.GRPCAddr), err)
	}
	if _, err := encodeNodeMeta(1, big); !errors.Is(err, ErrMetaTooLarge) {
		t.Errorf("encode: %v, want ErrMetaTooLarge", err)
	}
	long := sampleMeta()
	long.Version = strings.Repeat("v", 256)
	if err := long.Validate(); !errors.Is(err, ErrMetaTooLarge) {
		t.Errorf("256-byte version: %v, want ErrMetaTooLarge", err)
	}
	// The largest meta that fits is accepted.
	fit := sampleMeta()
	fit.Version = strings.Repeat("v", 255)
	fit.GRPCAddr = strings.Repeat("h", 150) + ":7070"
	if err := fit.Validate(); err != nil {
		t.Errorf("meta that fits: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*NodeMeta)
	}{
		{"address without port", func(m *NodeMeta) { m.GRPCAddr = "host" }},
		{"port 0", func(m *NodeMeta) { m.GRPCAddr = "host:0" }},
		{"empty host", func(m *NodeMeta) { m.GRPCAddr = ":7070" }},
		{"control character", func(m *NodeMeta) { m.Version = "v1\n" }},
		{"not UTF-8", func(m *NodeMeta) { m.Version = "\xff" }},
		{"upper-case backend", func(m *NodeMeta) { m.Backend = "CUDA" }},
		{"long backend", func(m *NodeMeta) { m.Backend = strings.Repeat("b", 17) }},
		{"devices", func(m *NodeMeta) { m.Devices = 1<<16 + 1 }},
		{"free > total", func(m *NodeMeta) { m.FreePages = m.TotalPages + 1 }},
	} {
		m := sampleMeta()
		tc.edit(&m)
		if err := m.Validate(); !errors.Is(err, ErrInvalidMeta) {
			t.Errorf("%s: %v, want ErrInvalidMeta", tc.name, err)
		}
	}
}

// TestDecodeNodeMetaRejects: bytes that are not questrt meta are refused;
// a later version's extra fields are ignored.
func TestDecodeNodeMetaRejects(t *testing.T) {
	good, _ := encodeNodeMeta(7, sampleMeta())
	later := append([]byte{}, good...)
	later[1] = 3
	later = append(later, 0x05, 0x01) // fields a later version appended
	if _, m, err := decodeNodeMeta(later); err != nil || m != sampleMeta() {
		t.Errorf("version 3 with extra fields: %+v, %v", m, err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrInvalidMeta},
		{"other program", []byte(`{"role":"x"}`), ErrInvalidMeta},
		{"version 0", []byte{metaMagic, 0}, ErrInvalidMeta},
		{"truncated", good[:len(good)-1], ErrInvalidMeta},
		{"trailing byte", append(append([]byte{}, good...), 0), ErrInvalidMeta},
		{"too large", append([]byte{metaMagic, 1}, make([]byte, memberlist.MetaMaxSize)...), ErrMetaTooLarge},
		{"huge string length", []byte{metaMagic, 1, 0, 0xff, 0xff, 0x03}, ErrInvalidMeta},
		{"bad varint", []byte{metaMagic, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, ErrInvalidMeta},
	} {
		if _, _, err := decodeNodeMeta(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// FuzzDecodeNodeMeta: no input panics the decoder; what decodes is valid
// and encodes to bytes that decode to the same.
func FuzzDecodeNodeMeta(f *testing.F) {
	good, _ := encodeNodeMeta(42, sampleMeta())
	f.Add(good)
	empty, _ := encodeNodeMeta(0, NodeMeta{})
	f.Add(empty)
	f.Add([]byte{metaMagic, 2, 1, 0, 0, 0, 0, 0, 0, 0, 9})
	f.Add([]byte("not meta"))
	f.Fuzz(func(t *testing.T, b []byte) {
		inst, m, err := decodeNodeMeta(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidMeta) && !errors.Is(err, ErrMetaTooLarge) {
				t.Fatalf("error without a sentinel: %v", err)
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded invalid meta %+v: %v", m, err)
		}
		re, err := encodeNodeMeta(inst, m)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", m, err)
		}
		inst2, m2, err := decodeNodeMeta(re)
		if err != nil || inst2 != inst || m2 != m {
			t.Fatalf("re-decode: %+v/%d, %v; want %+v/%d", m2, inst2, err, m, inst)
		}
	})
}

// FuzzDecodeGossipMessages: the leave intent, its acknowledgement and the
// departed-members list
// (user messages from peers) never panic the decoders, and round-trip.
func FuzzDecodeGossipMessages(f *testing.F) {
	f.Add(encodeLeaveMsg(msgLeaveIntent, 99, "n1"))
	f.Add(encodeLeaveMsg(msgLeaveAck, 99, "n2"))
	f.Add(encodeLeftList([]leftMember{{"a", 1}, {"b", 2}}))
	f.Add([]byte{msgLeftList, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, typ := range []byte{msgLeaveIntent, msgLeaveAck} {
			inst, name, err := decodeLeaveMsg(b, typ)
			if err != nil {
				continue
			}
			if re := encodeLeaveMsg(typ, inst, name); !bytes.Equal(re, b) {
				// Only a non-minimal varint can differ; it must decode the same.
				if i2, n2, err := decodeLeaveMsg(re, typ); err != nil || n2 != name || i2 != inst {
					t.Fatalf("message %d round trip: %q/%d vs %q/%d, %v", typ, name, inst, n2, i2, err)
				}
			}
		}
		if left, err := decodeLeftList(b); err == nil {
			if len(left) > maxLeftList {
				t.Fatalf("%d entries", len(left))
			}
			if _, err := decodeLeftList(encodeLeftList(left)); err != nil {
				t.Fatalf("left list round trip: %v", err)
			}
		}
	})
}

// TestNodeMetaTransport: the transport travels as the last field of
// version 2; a version-1 peer's bytes (written out by hand here) decode
// as TransportUnknown, and a transport past TransportTLS is refused.
func TestNodeMetaTransport(t *testing.T) {
	// Version 1: instance 7, grpc "a:1", version "v", backend "cpu",
	// devices 1, free 2, total 3, free bytes 4.
	v1 := []byte{metaMagic, 1, 7, 3, 'a', ':', '1', 1, 'v', 3, 'c', 'p', 'u', 1, 2, 3, 4}
	inst, m, err := decodeNodeMeta(v1)
	want := NodeMeta{GRPCAddr: "a:1", Version: "v", Backend: "cpu", Devices: 1, FreePages: 2, TotalPages: 3, FreeBytes: 4}
	if err != nil || inst != 7 || m != want || m.Transport != TransportUnknown {
		t.Errorf("version 1: %d %+v %v, want 7 %+v", inst, m, err, want)
	}
	for tr, b := range map[Transport]byte{TransportPlaintext: 1, TransportTLS: 2} {
		v2 := append([]byte{metaMagic, 2}, v1[2:]...)
		v2 = append(v2, b)
		_, m, err := decodeNodeMeta(v2)
		if err != nil || m.Transport != tr {
			t.Errorf("version 2, transport byte %d: %+v %v, want %v", b, m, err, tr)
		}
		w := want
		w.Transport = tr
		enc, err := encodeNodeMeta(7, w)
		if err != nil || !bytes.Equal(enc, v2) {
			t.Errorf("encode %v: %x %v, want %x", tr, enc, err, v2)
		}
	}
	bad := append(append([]byte{metaMagic, 2}, v1[2:]...), 3)
	if _, _, err := decodeNodeMeta(bad); !errors.Is(err, ErrInvalidMeta) {
		t.Errorf("transport 3: %v, want ErrInvalidMeta", err)
	}
	if err := (NodeMeta{Transport: 3}).Validate(); !errors.Is(err, ErrInvalidMeta) {
		t.Errorf("Validate transport 3: %v, want ErrInvalidMeta", err)
	}
	if TransportPlaintext.String() != "plaintext" || TransportTLS.String() != "tls" || TransportUnknown.String() != "unknown" {
		t.Errorf("names: %v %v %v", TransportPlaintext, TransportTLS, TransportUnknown)
	}
}
