package node

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
)

// TestCountingCodecRefusal: the codec decodes a request at its limit
// like gRPC's proto codec, leaves one past it empty and keeps the
// refusal, which refusal answers once (RESOURCE_EXHAUSTED naming the
// limit) and forgets; a receive error passes through unchanged.
func TestCountingCodecRefusal(t *testing.T) {
	c := newCountingCodec(3)
	req := func(n int) mem.BufferSlice {
		m := &workerv1.BeginRequest{Step: 7}
		for i := range n {
			m.Seqs = append(m.Seqs, &workerv1.StepSeq{Seq: uint64(i + 1)})
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}
	}
	var ok workerv1.BeginRequest
	if err := c.Unmarshal(req(3), &ok); err != nil || len(ok.Seqs) != 3 || ok.Step != 7 {
		t.Fatalf("at the limit: %v, %d seqs, step %d; want 3 seqs of step 7", err, len(ok.Seqs), ok.Step)
	}
	if err := c.refusal(&ok, nil); err != nil {
		t.Errorf("refusal of an accepted request: %v", err)
	}
	var big workerv1.BeginRequest
	if err := c.Unmarshal(req(4), &big); err != nil || len(big.Seqs) != 0 || big.Step != 0 {
		t.Fatalf("past the limit: %v, %d seqs, step %d; want nil and nothing decoded", err, len(big.Seqs), big.Step)
	}
	err := c.refusal(&big, nil)
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "more than 3 elements") {
		t.Errorf("refusal: %v, want RESOURCE_EXHAUSTED naming the limit 3", err)
	}
	if err := c.refusal(&big, nil); err != nil {
		t.Errorf("second refusal look-up: %v, want nil (forgotten)", err)
	}
	recvErr := errors.New("stream broke")
	if err := c.refusal(&ok, recvErr); err != recvErr {
		t.Errorf("receive error: %v, want it unchanged", err)
	}
	n := 0
	c.refused.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Errorf("%d refusals kept after the look-ups, want 0", n)
	}
}
