package remote

import (
	"context"
	"fmt"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/worker"
)

// Create implements workerv1.WorkerServer.
func (s *Server) Create(ctx context.Context, r *workerv1.CreateRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		d := &dec{what: "create request", sentinel: worker.ErrBadMessage}
		m := worker.CreateRequest{Seq: r.Seq, Layout: decodeLayout(d, r.Layout)}
		if d.err != nil {
			return d.err
		}
		return g.local.Create(ctx, m)
	}))
}

// Fork implements workerv1.WorkerServer.
func (s *Server) Fork(ctx context.Context, r *workerv1.ForkRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		return g.local.Fork(ctx, worker.ForkRequest{Parent: r.Parent, Child: r.Child})
	}))
}

// Release implements workerv1.WorkerServer.
func (s *Server) Release(ctx context.Context, r *workerv1.ReleaseRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		return g.local.Release(ctx, worker.ReleaseRequest{Seq: r.Seq})
	}))
}

// Check implements workerv1.WorkerServer.
func (s *Server) Check(ctx context.Context, r *workerv1.CheckRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		m, err := decodeCheck(r)
		if err != nil {
			return err
		}
		return g.local.Check(ctx, m)
	}))
}

// Append implements workerv1.WorkerServer.
func (s *Server) Append(ctx context.Context, r *workerv1.AppendRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		m, err := decodeAppend(g.geo, r)
		if err != nil {
			return err
		}
		return g.local.Append(ctx, m)
	}))
}

// Rollback implements workerv1.WorkerServer.
func (s *Server) Rollback(ctx context.Context, r *workerv1.RollbackRequest) (*workerv1.RollbackReply, error) {
	var rep *workerv1.RollbackReply
	err := s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		// At most one tail record and one length per layer: counted
		// before decoding.
		if nt, nl := len(r.GetTail()), len(r.GetLens()); nt > g.cfg.Layers || nl > g.cfg.Layers {
			return fmt.Errorf("%w: rollback request: %d tail records and %d lengths for %d layers", worker.ErrBadMessage, nt, nl, g.cfg.Layers)
		}
		m, err := decodeRollback(g.geo, r)
		if err != nil {
			return err
		}
		out, err := g.local.Rollback(ctx, m)
		if err != nil {
			return err
		}
		rep, err = encodeRollbackReply(g.geo, out)
		return err
	})
	if err != nil {
		return nil, err
	}
	return rep, nil
}

func ack(err error) (*workerv1.Ack, error) {
	if err != nil {
		return nil, err
	}
	return &workerv1.Ack{}, nil
}

// Keys implements workerv1.WorkerServer.
func (s *Server) Keys(ctx context.Context, r *workerv1.KeysRequest) (*workerv1.KeysReply, error) {
	var rep *workerv1.KeysReply
	err := s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		m, err := decodeKeys(r)
		if err != nil {
			return err
		}
		var out worker.KeysReply
		if err := g.local.Keys(ctx, m, &out); err != nil {
			return err
		}
		rep, err = encodeKeysReply(g.geo, &out)
		return err
	})
	if err != nil {
		return nil, err
	}
	return rep, nil
}
