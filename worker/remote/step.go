package remote

import (
	"context"
	"errors"
	"fmt"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/worker"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// BeginStep implements workerv1.WorkerServer.
func (s *Server) BeginStep(ctx context.Context, r *workerv1.BeginRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		// A batch larger than the grid's sequences here is refused
		// before its entries are decoded.
		ids := func(yield func(uint64) bool) {
			for _, sq := range r.GetSeqs() {
				if !yield(sq.GetSeq()) {
					return
				}
			}
		}
		if err := g.local.CheckBatch(len(r.GetSeqs()), ids); err != nil {
			return fmt.Errorf("begin step %d: %w", r.Step, err)
		}
		m, err := decodeBegin(r)
		if err != nil {
			return err
		}
		if err := g.local.BeginStep(ctx, m); err != nil {
			return err
		}
		fresh := 0
		for _, sq := range m.Seqs {
			if sq.New {
				fresh++
			}
		}
		g.mu.Lock()
		g.step, g.open, g.seqs, g.fresh = m.Step, true, len(m.Seqs), fresh
		g.mu.Unlock()
		return nil
	}))
}

// layerTrailer is the trailer key of a Layer call that failed after the
// worker accepted it: the binary google.rpc.Status of the error (its
// ErrorInfo details), beside the reply's error_code and error_message.
const layerTrailer = "questrt-layer-status-bin"

// Layer implements workerv1.WorkerServer. A request the worker refused
// (nothing appended, a refusal sentinel) answers an error status; an error
// after the worker accepted it answers OK with the ranks' outputs (their
// Appended counts) and error_code and error_message set, the error's
// details in the trailer layerTrailer.
func (s *Server) Layer(ctx context.Context, r *workerv1.LayerRequest) (*workerv1.LayerReply, error) {
	var rep *workerv1.LayerReply
	err := s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		seqs, fresh := anyDim, anyDim
		g.mu.Lock()
		if g.open && g.step == r.Step {
			seqs, fresh = g.seqs, g.fresh
		}
		g.mu.Unlock()
		// One input per hosted rank: counted before decoding.
		if n := len(r.GetRanks()); n != len(g.ranks) {
			return fmt.Errorf("layer %d of step %d: %w: layer request: %d rank inputs for %d hosted ranks", r.Layer, r.Step, worker.ErrBadMessage, n, len(g.ranks))
		}
		m, err := decodeLayer(g.geo, r, seqs, fresh)
		if err != nil {
			return fmt.Errorf("layer %d of step %d: %w", r.Layer, r.Step, err)
		}
		var out worker.LayerReply
		lerr := s.scrubDamage(g, g.local.Layer(ctx, m, &out))
		if lerr != nil && refused(lerr, &out) {
			return lerr
		}
		if rep, err = encodeLayerReply(g.geo, &out); err != nil {
			return errors.Join(lerr, err)
		}
		if lerr != nil {
			st := ToStatus(lerr)
			rep.ErrorCode, rep.ErrorMessage = uint32(st.Code()), st.Message()
			if b, err := proto.Marshal(st.Proto()); err == nil {
				// No stream when called directly (tests): nothing to set.
				_ = grpc.SetTrailer(ctx, metadata.Pairs(layerTrailer, string(b)))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return rep, nil
}

// refused reports whether a Layer error is a refusal that changed
// nothing: a refusal sentinel, no ErrChanged, no token taken.
func refused(err error, rep *worker.LayerReply) bool {
	for _, o := range rep.Ranks {
		if o.Appended > 0 {
			return false
		}
	}
	if errors.Is(err, worker.ErrChanged) {
		return false
	}
	for _, s := range []error{worker.ErrBadMessage, worker.ErrUnknownSequence, worker.ErrNotHosted, worker.ErrStep, worker.ErrStepOpen, worker.ErrClosed} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// EndStep implements workerv1.WorkerServer.
func (s *Server) EndStep(ctx context.Context, r *workerv1.EndRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		m := decodeEnd(r, g.cfg.Layers)
		g.mu.Lock()
		if g.step == m.Step {
			g.open = false
		}
		g.mu.Unlock()
		return g.local.EndStep(ctx, m)
	}))
}
