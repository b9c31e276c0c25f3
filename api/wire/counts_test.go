package wire

import (
	"errors"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
)

// reflectCount counts the elements of m's repeated fields at every depth
// from the decoded message (protoreflect), the reference CheckCounts'
// wire walk must agree with.
func reflectCount(m protoreflect.Message) int {
	n := 0
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			l := v.List()
			n += l.Len()
			if fd.Kind() == protoreflect.MessageKind {
				for i := range l.Len() {
					n += reflectCount(l.Get(i).Message())
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			n += reflectCount(v.Message())
		}
		return true
	})
	return n
}

// randomMessages are requests of the worker and client APIs with random
// numbers of entries in their repeated fields, nested ones included, and
// random values (zeros, one-byte and ten-byte varints).
func randomMessages(rng *rand.Rand) []proto.Message {
	u64 := func() uint64 {
		switch rng.IntN(3) {
		case 0:
			return 0
		case 1:
			return uint64(rng.IntN(128))
		}
		return rng.Uint64()
	}
	tensor := func() *workerv1.Tensor {
		t := &workerv1.Tensor{Data: make([]byte, rng.IntN(16))}
		for range rng.IntN(4) {
			t.Shape = append(t.Shape, uint32(u64()))
		}
		return t
	}
	begin := &workerv1.BeginRequest{Ref: &workerv1.GridRef{Grid: "g", View: u64()}, Step: u64()}
	for range rng.IntN(50) {
		begin.Seqs = append(begin.Seqs, &workerv1.StepSeq{Seq: u64(), Len: u64(), Budget: uint32(u64())})
	}
	layer := &workerv1.LayerRequest{Ref: &workerv1.GridRef{Grid: "g"}, Layer: uint32(u64())}
	for range rng.IntN(6) {
		layer.Ranks = append(layer.Ranks, &workerv1.RankInput{Rank: &workerv1.Rank{Cp: uint32(u64())}, Q: tensor(), K: tensor()})
	}
	rb := &workerv1.RollbackRequest{Seq: u64()}
	for range rng.IntN(40) {
		rb.Lens = append(rb.Lens, uint32(u64()))
	}
	for range rng.IntN(5) {
		rb.Tail = append(rb.Tail, tensor())
	}
	cg := &workerv1.ConnectGridRequest{}
	for range rng.IntN(20) {
		cg.Peers = append(cg.Peers, "")
		cg.Placement = append(cg.Placement, "node-a")
	}
	st := &decodev1.StepRequest{}
	for range rng.IntN(20) {
		st.Items = append(st.Items, &decodev1.StepItem{})
	}
	return []proto.Message{begin, layer, rb, cg, st}
}

// TestCheckCountsMatchesDecoded: on random requests of both APIs,
// CheckCounts accepts a limit equal to the count of the decoded message
// (protoreflect) and refuses one below it with ErrTooManyElements.
func TestCheckCountsMatchesDecoded(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		for _, m := range randomMessages(rng) {
			b, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			md := m.ProtoReflect().Descriptor()
			want := reflectCount(m.ProtoReflect())
			if err := CheckCounts(b, md, want); err != nil {
				t.Fatalf("run %d: %s with %d elements, limit %d: %v", i, md.FullName(), want, want, err)
			}
			if want == 0 {
				continue
			}
			if err := CheckCounts(b, md, want-1); !errors.Is(err, ErrTooManyElements) {
				t.Fatalf("run %d: %s with %d elements, limit %d: %v, want ErrTooManyElements", i, md.FullName(), want, want-1, err)
			}
		}
	}
}

// TestCheckCountsEmptyEntries: a BeginRequest of a million empty StepSeq
// entries (2 bytes each on the wire) is refused past the limit, and
// CheckCounts allocates nothing on it.
func TestCheckCountsEmptyEntries(t *testing.T) {
	const entries = 1 << 20
	var b []byte
	for range entries {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendBytes(b, nil)
	}
	md := (&workerv1.BeginRequest{}).ProtoReflect().Descriptor()
	if err := CheckCounts(b, md, entries); err != nil {
		t.Fatalf("limit %d: %v", entries, err)
	}
	if err := CheckCounts(b, md, 1000); !errors.Is(err, ErrTooManyElements) {
		t.Fatalf("limit 1000: %v, want ErrTooManyElements", err)
	}
	if a := testing.AllocsPerRun(5, func() { _ = CheckCounts(b, md, entries) }); a != 0 {
		t.Errorf("%v allocations per walk, want 0", a)
	}
	// The reference: decoding makes one StepSeq per entry.
	var m workerv1.BeginRequest
	if err := proto.Unmarshal(b, &m); err != nil || len(m.Seqs) != entries {
		t.Fatalf("decoded %d entries (%v), want %d", len(m.Seqs), err, entries)
	}
}

// FuzzCheckCounts: CheckCounts never panics, and whatever it accepts
// under a limit decodes (when it decodes) to at most that many elements.
func FuzzCheckCounts(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, m := range randomMessages(rng) {
		b, _ := proto.Marshal(m)
		f.Add(b, uint16(10))
	}
	f.Fuzz(func(t *testing.T, b []byte, limit uint16) {
		var m workerv1.RollbackRequest
		err := CheckCounts(b, m.ProtoReflect().Descriptor(), int(limit))
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		if n := reflectCount(m.ProtoReflect()); err == nil && n > int(limit) {
			t.Fatalf("accepted %d elements under limit %d", n, limit)
		}
	})
}
