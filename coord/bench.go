package coord

import (
	"context"
	"fmt"
	"slices"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/worker/remote"
)

// BenchCollective runs the collective benchmark spec with one rank on
// each of nodes members that are up (0: all of them): this coordinator's
// node is rank 0, the others follow by name. It returns every rank's
// report (remote.RunGroupBench). More nodes than are up, fewer than 2,
// or a bad spec wrap engine.ErrBadInput and run nothing; a node that
// fails mid-run is named in the error, which wraps remote.ErrUnavailable
// when the node could not be reached.
func (c *Coordinator) BenchCollective(ctx context.Context, nodes int, spec *workerv1.BenchSpec) ([]remote.BenchReport, error) {
	v := c.cfg.View()
	up := v.Up()
	var others []string
	self := false
	for _, m := range up {
		if m.Name == c.cfg.Name {
			self = true
		} else if m.MetaErr == nil {
			others = append(others, m.Name)
		}
	}
	slices.Sort(others)
	avail := len(others)
	if self {
		avail++
	}
	if nodes == 0 {
		nodes = avail
	}
	switch {
	case !self:
		return nil, fmt.Errorf("bench collective: %w: this node (%s) is not up in its own view", remote.ErrUnavailable, c.cfg.Name)
	case nodes < 2 || nodes > avail:
		return nil, fmt.Errorf("bench collective: %w: %d nodes: want 2 to the %d nodes up", engine.ErrBadInput, nodes, avail)
	}
	if _, err := remote.DecodeBenchSpec(spec, nodes); err != nil {
		return nil, fmt.Errorf("bench collective: %w: %w", engine.ErrBadInput, err)
	}
	names := append([]string{c.cfg.Name}, others[:nodes-1]...)
	bn := make([]remote.BenchNode, nodes)
	for r, name := range names {
		m, _ := v.Member(name)
		conn, err := c.cfg.Conn(m.Meta.GRPCAddr)
		if err != nil {
			return nil, fmt.Errorf("bench collective: node %s at %q: %w: %w", name, m.Meta.GRPCAddr, remote.ErrUnavailable, err)
		}
		bn[r] = remote.BenchNode{Name: name, Addr: m.Meta.GRPCAddr, Conn: workerv1.NewWorkerClient(conn)}
	}
	reps, err := remote.RunGroupBench(ctx, remote.BenchID(c.cfg.Name), spec, bn)
	if err != nil {
		return nil, fmt.Errorf("bench collective: %w", err)
	}
	return reps, nil
}
