package wire

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ErrTooManyElements: a message's repeated fields hold more elements than
// the receiver takes (CheckCounts).
var ErrTooManyElements = errors.New("wire: too many repeated elements")

// maxDepth bounds the nesting CheckCounts follows (the APIs' messages
// nest a few levels; proto.Unmarshal's own limit is 10,000).
const maxDepth = 64

// CheckCounts walks b, the encoding of a message of descriptor md,
// without decoding it, and counts the elements of its repeated fields at
// every depth (each entry of a repeated message, string or bytes field,
// each number of a packed or unpacked repeated scalar). Past limit it
// returns an error wrapping ErrTooManyElements that names the message
// and the limit, before anything is allocated for the entries: decoding
// costs tens of bytes per element (an empty message entry is 2 bytes on
// the wire and about 100 decoded), so a receiver bounds the count, not
// only the size. Fields md does not know (and malformed data, left for
// proto.Unmarshal to refuse) are skipped. It allocates nothing.
func CheckCounts(b []byte, md protoreflect.MessageDescriptor, limit int) error {
	n, err := countMessage(b, md, limit, 0, 0)
	if err != nil {
		return err
	}
	if n > limit {
		return tooMany(md, n, limit)
	}
	return nil
}

func tooMany(md protoreflect.MessageDescriptor, n, limit int) error {
	return fmt.Errorf("%w: %s holds more than %d elements in its repeated fields (at least %d)", ErrTooManyElements, md.FullName(), limit, n)
}

// countMessage adds the repeated elements of the message b to n and
// returns the new count; it stops early once n passes limit.
func countMessage(b []byte, md protoreflect.MessageDescriptor, limit, n, depth int) (int, error) {
	if depth > maxDepth {
		return n, fmt.Errorf("%w: %s nests deeper than %d", ErrTooManyElements, md.FullName(), maxDepth)
	}
	fields := md.Fields()
	for len(b) > 0 {
		num, typ, tl := protowire.ConsumeTag(b)
		if tl < 0 {
			return n, nil // malformed: proto.Unmarshal says so
		}
		b = b[tl:]
		vl := protowire.ConsumeFieldValue(num, typ, b)
		if vl < 0 {
			return n, nil
		}
		v := b[:vl]
		b = b[vl:]
		fd := fields.ByNumber(num)
		if fd == nil {
			continue // unknown fields are kept as raw bytes
		}
		if fd.IsList() || fd.IsMap() {
			if typ == protowire.BytesType && fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind &&
				fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.BytesKind {
				n += packedCount(v, fd.Kind())
			} else {
				n++
			}
			if n > limit {
				return n, nil
			}
		}
		if typ == protowire.BytesType && (fd.Kind() == protoreflect.MessageKind) {
			body, bl := protowire.ConsumeBytes(v)
			if bl < 0 {
				return n, nil
			}
			var err error
			if n, err = countMessage(body, fd.Message(), limit, n, depth+1); err != nil || n > limit {
				return n, err
			}
		}
	}
	return n, nil
}

// packedCount is the number of scalars of kind k in the packed field
// value v (its length prefix included).
func packedCount(v []byte, k protoreflect.Kind) int {
	body, bl := protowire.ConsumeBytes(v)
	if bl < 0 {
		return 0
	}
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return len(body) / 4
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return len(body) / 8
	}
	c := 0
	for _, x := range body {
		if x < 0x80 {
			c++ // the last byte of a varint
		}
	}
	return c
}
