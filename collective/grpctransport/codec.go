package grpctransport

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "github.com/questrt/questrt/api/collective/v1"
)

// frameCodec is the gRPC codec of the collective's streams, set on both
// ends of each (the server's ForceServerCodecV2, the dialed stream's
// ForceCodecV2). Its bytes on the wire are those of gRPC's proto codec
// (its name is "proto", so a peer that uses gRPC's codec reads them); it
// differs in the buffers.
//
// gRPC's codec marshals into a buffer of its default pool and
// unmarshals from one, and that pool clears every buffer it hands out,
// over the capacity of its tier, which jumps from 32 KiB to 1 MiB: a
// select frame of 131 KB cleared 1 MiB when sent and again when
// received, and was copied twice on each side. frameCodec sends a
// Message frame as a few bytes of field headers followed by the payload
// itself (a copy that Transport.Send made and nothing writes again), and
// receives one by copying its payload once into a buffer of its exact
// length, which Go's allocator aligns to 8 bytes from 16 bytes on, as the
// collective's in-place parse of select frames wants.
// Any other frame, or a Message frame that is not in the one layout gRPC's
// codec writes, goes through proto.Marshal and proto.Unmarshal.
type frameCodec struct{}

// Name returns "proto": the content-subtype of gRPC's own codec, whose
// bytes frameCodec writes and reads.
func (frameCodec) Name() string { return "proto" }

// Field headers of a Frame holding a Message (see collective.proto):
// Frame.message is field 2, length-delimited; Message.tag is field 1,
// fixed64; Message.payload is field 2, length-delimited.
const (
	frameMessageKey = 2<<3 | 2
	messageTagKey   = 1<<3 | 1
	messagePayKey   = 2<<3 | 2
	// maxMessageHead bounds the bytes before a Message frame's payload:
	// two keys and two varints of at most 10 bytes, and the tag.
	maxMessageHead = 1 + binary.MaxVarintLen64 + 1 + 8 + 1 + binary.MaxVarintLen64
)

// Marshal implements encoding.CodecV2.
func (frameCodec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*pb.Frame); ok {
		if head, payload, ok := messageHead(f); ok {
			if len(payload) == 0 {
				return mem.BufferSlice{mem.SliceBuffer(head)}, nil
			}
			return mem.BufferSlice{mem.SliceBuffer(head), mem.SliceBuffer(payload)}, nil
		}
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("grpctransport: cannot marshal %T, want a proto.Message", v)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

// messageHead returns the bytes proto.Marshal writes before the payload
// of f when f is a Message frame without unknown fields (ok true): f's
// encoding is head followed by payload.
func messageHead(f *pb.Frame) (head, payload []byte, ok bool) {
	m := f.GetMessage()
	if m == nil || len(f.ProtoReflect().GetUnknown()) != 0 || len(m.ProtoReflect().GetUnknown()) != 0 {
		return nil, nil, false
	}
	payload = m.GetPayload()
	mlen := 0
	if m.GetTag() != 0 {
		mlen += 1 + 8
	}
	if len(payload) > 0 {
		mlen += 1 + varintLen(uint64(len(payload))) + len(payload)
	}
	head = make([]byte, 0, maxMessageHead)
	head = append(head, frameMessageKey)
	head = binary.AppendUvarint(head, uint64(mlen))
	if m.GetTag() != 0 {
		head = append(head, messageTagKey)
		head = binary.LittleEndian.AppendUint64(head, m.GetTag())
	}
	if len(payload) > 0 {
		head = append(head, messagePayKey)
		head = binary.AppendUvarint(head, uint64(len(payload)))
	}
	return head, payload, true
}

func varintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// Unmarshal implements encoding.CodecV2. gRPC frees data when it returns;
// nothing of v refers to it.
func (frameCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*pb.Frame); ok {
		if m, ok := decodeMessage(data); ok {
			proto.Reset(f)
			f.Kind = &pb.Frame_Message{Message: m}
			return nil
		}
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("grpctransport: cannot unmarshal into %T, want a proto.Message", v)
	}
	return proto.Unmarshal(data.Materialize(), m)
}

// decodeMessage decodes data as a Frame holding a Message when it is in
// the layout proto.Marshal writes (messageHead): one Frame field, the
// message, whose fields are the tag (absent when 0) and then the payload
// (absent when empty), each once, each length exact. It reports false for
// anything else, which proto.Unmarshal then decodes or refuses; when it
// reports true, the Message is the one proto.Unmarshal would return (up
// to an empty payload being nil).
func decodeMessage(data mem.BufferSlice) (*pb.Message, bool) {
	var buf [maxMessageHead]byte
	n := 0
	for _, b := range data {
		if n += copy(buf[n:], b.ReadOnlyData()); n == len(buf) {
			break
		}
	}
	h, total := buf[:n], data.Len()
	if len(h) < 2 || h[0] != frameMessageKey {
		return nil, false
	}
	mlen, k := binary.Uvarint(h[1:])
	pos := 1 + k
	if k <= 0 || uint64(total-pos) != mlen {
		return nil, false
	}
	m := &pb.Message{}
	if pos < total && h[pos] == messageTagKey {
		if pos+9 > len(h) {
			return nil, false
		}
		m.Tag = binary.LittleEndian.Uint64(h[pos+1:])
		pos += 9
	}
	if pos == total {
		return m, true
	}
	if pos >= len(h) || h[pos] != messagePayKey {
		return nil, false
	}
	plen, k := binary.Uvarint(h[pos+1:])
	pos += 1 + k
	if k <= 0 || uint64(total-pos) != plen {
		return nil, false
	}
	m.Payload = make([]byte, plen)
	copyFrom(m.Payload, data, pos)
	return m, true
}

// copyFrom copies data's bytes from offset off on into dst.
func copyFrom(dst []byte, data mem.BufferSlice, off int) {
	for _, b := range data {
		d := b.ReadOnlyData()
		if off >= len(d) {
			off -= len(d)
			continue
		}
		dst = dst[copy(dst, d[off:]):]
		off = 0
		if len(dst) == 0 {
			return
		}
	}
}
