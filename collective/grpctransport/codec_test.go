package grpctransport

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"unsafe"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "github.com/questrt/questrt/api/collective/v1"
)

// split returns b as a BufferSlice of up to parts buffers cut at random
// places (gRPC hands a message over in the pieces its HTTP/2 frames
// brought), some of them empty.
func split(rng *rand.Rand, b []byte, parts int) mem.BufferSlice {
	var s mem.BufferSlice
	for range parts - 1 {
		n := 0
		if len(b) > 0 {
			n = rng.IntN(len(b) + 1)
			if rng.IntN(2) == 0 {
				n = min(n, rng.IntN(16)) // cuts inside the field headers
			}
		}
		s = append(s, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return append(s, mem.SliceBuffer(b))
}

func randomFrame(rng *rand.Rand) *pb.Frame {
	switch rng.IntN(6) {
	case 0:
		return &pb.Frame{Kind: &pb.Frame_Hello{Hello: &pb.Hello{Protocol: 1, Group: "g", Rank: rng.Uint32N(8), Size: 8, MaxMessageBytes: rng.Uint64()}}}
	case 1:
		return byeFrame
	case 2:
		return &pb.Frame{}
	}
	m := &pb.Message{}
	if rng.IntN(4) != 0 {
		m.Tag = rng.Uint64() >> rng.UintN(64)
	}
	switch rng.IntN(4) {
	case 0: // nil payload
	case 1:
		m.Payload = []byte{}
	case 2:
		m.Payload = make([]byte, 1+rng.IntN(200))
	default:
		m.Payload = make([]byte, rng.IntN(300_000))
	}
	for i := range m.Payload {
		m.Payload[i] = byte(rng.Uint32())
	}
	return &pb.Frame{Kind: &pb.Frame_Message{Message: m}}
}

// TestFrameCodec: frameCodec writes exactly proto.Marshal's bytes for
// every kind of frame (so a peer on gRPC's codec reads them), and reads
// back, from any split of those bytes into buffers, a frame proto.Equal
// to the one sent; a received payload of 16 bytes or more is 8-byte
// aligned (the collective reads select frames in place when it is).
func TestFrameCodec(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var c frameCodec
	for trial := range 500 {
		f := randomFrame(rng)
		want, err := proto.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.Marshal(f)
		if err != nil {
			t.Fatalf("trial %d: marshal: %v", trial, err)
		}
		if got := out.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("trial %d: marshal wrote %d bytes, proto.Marshal %d (or other bytes)", trial, len(got), len(want))
		}
		got := &pb.Frame{Kind: &pb.Frame_Bye{Bye: &pb.Bye{}}} // reset by Unmarshal
		if err := c.Unmarshal(split(rng, want, 1+rng.IntN(12)), got); err != nil {
			t.Fatalf("trial %d: unmarshal: %v", trial, err)
		}
		if !proto.Equal(got, f) {
			t.Fatalf("trial %d: unmarshal gave another frame", trial)
		}
		// Go's allocator aligns objects of 16 bytes and more to 8 (smaller
		// ones may share a tiny block); a select frame has 16 or more.
		if p := got.GetMessage().GetPayload(); len(p) >= 16 && uintptr(unsafe.Pointer(&p[0]))%8 != 0 {
			t.Fatalf("trial %d: payload of %d bytes not 8-byte aligned", trial, len(p))
		}
	}
}

// TestFrameCodecMarshalNoCopy: a Message frame's payload is sent from the
// frame's own bytes, not copied (the point of the codec).
func TestFrameCodecMarshalNoCopy(t *testing.T) {
	p := make([]byte, 1<<17)
	out, err := frameCodec{}.Marshal(&pb.Frame{Kind: &pb.Frame_Message{Message: &pb.Message{Tag: 7, Payload: p}}})
	if err != nil {
		t.Fatal(err)
	}
	last := out[len(out)-1].ReadOnlyData()
	if len(last) != len(p) || &last[0] != &p[0] {
		t.Fatalf("payload copied: %d buffers", len(out))
	}
}

// FuzzFrameCodecUnmarshal: on any bytes, split anywhere, frameCodec's
// Unmarshal fails exactly when proto.Unmarshal does and otherwise gives
// the frame proto.Unmarshal gives.
func FuzzFrameCodecUnmarshal(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		b, err := proto.Marshal(randomFrame(rng))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:min(len(b), 64)], uint8(3), uint64(1))
	}
	f.Add([]byte{0x12, 0x0b, 0x12, 0x01, 0xaa, 0x09, 1, 2, 3, 4, 5, 6, 7, 8}, uint8(2), uint64(5)) // payload before tag
	f.Add([]byte{0x12, 0x02, 0x12, 0x00}, uint8(1), uint64(0))                                     // empty payload, present
	f.Add([]byte{0x12, 0x80, 0x00}, uint8(1), uint64(0))                                           // non-minimal varint
	f.Fuzz(func(t *testing.T, b []byte, parts uint8, seed uint64) {
		want := &pb.Frame{}
		werr := proto.Unmarshal(b, want)
		got := &pb.Frame{}
		gerr := frameCodec{}.Unmarshal(split(rand.New(rand.NewPCG(seed, 0)), b, 1+int(parts%8)), got)
		if (gerr != nil) != (werr != nil) {
			t.Fatalf("codec error %v, proto.Unmarshal error %v", gerr, werr)
		}
		if werr == nil && !proto.Equal(got, want) {
			t.Fatalf("codec gave another frame than proto.Unmarshal")
		}
	})
}
