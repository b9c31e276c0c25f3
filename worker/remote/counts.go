package remote

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/questrt/questrt/api/wire"
	"github.com/questrt/questrt/worker"
)

// MinRequestElements is the least MaxRequestElements allows.
const MinRequestElements = 1 << 16

// MaxRequestElements bounds the elements of the repeated fields of one
// request of the worker or client API on a node that hosts maxPages pages
// (0: no page bound), at every depth (wire.CheckCounts): a node refuses
// a request past it with RESOURCE_EXHAUSTED before decoding it. The
// entries of a request name sequences of a batch, ranks, peers, layers
// and tensor dimensions: a batch names sequences of one grid, which
// holds at most CP x Capacity of them (worker.Config.MaxSequences), a
// node hosts at most maxPages ranks (each rank takes at least one page),
// and a grid's peers are its ranks. So the bound is 2 x maxPages, at
// least MinRequestElements (65,536) for small nodes: a batch larger
// than that, or a grid of more ranks, does not reach the node. Decoding
// costs about 100 bytes per element at most (an empty message entry),
// so a request at the bound decodes to about 100 x the bound bytes,
// where a message of empty entries of gRPC's size limit would decode to
// 50 x its size.
func MaxRequestElements(maxPages int) int {
	return max(MinRequestElements, 2*maxPages)
}

// MaxReplyElements bounds the elements of the repeated fields of one
// reply of the worker API for a grid of config cfg, at every depth
// (wire.CheckCounts): a client refuses a reply past it before decoding
// it, as a node refuses a request. A reply names each of the grid's
// sequences at most once in each of its per-sequence fields (lengths,
// rolled back, had lengths, recovered: four), and each of its CP x TP
// ranks at most once; at least MinRequestElements.
func MaxReplyElements(cfg worker.Config) int {
	return max(MinRequestElements, 4*cfg.MaxSequences()+cfg.CP*cfg.TP)
}

// checkReplyCounts refuses b, the encoding of a reply like m, when its
// repeated fields hold more than limit elements (0: no bound):
// RESOURCE_EXHAUSTED, naming the limit.
func checkReplyCounts(b []byte, m proto.Message, limit int) error {
	if limit <= 0 {
		return nil
	}
	if err := wire.CheckCounts(b, m.ProtoReflect().Descriptor(), limit); err != nil {
		return status.Errorf(codes.ResourceExhausted, "reply refused before decoding: %v", err)
	}
	return nil
}

// checkCounts refuses b, the encoding of a request like m, when its
// repeated fields hold more than limit elements: RESOURCE_EXHAUSTED,
// naming the limit.
func checkCounts(b []byte, m proto.Message, limit int) error {
	if err := wire.CheckCounts(b, m.ProtoReflect().Descriptor(), limit); err != nil {
		return status.Errorf(codes.ResourceExhausted, "request refused before decoding: %v", err)
	}
	return nil
}
