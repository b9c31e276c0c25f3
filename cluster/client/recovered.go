package client

import (
	"context"
	"fmt"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
)

// Recovered is a sequence a restarted node adopted from its data
// directory (questd --data-dir): usable as any sequence under ID.
type Recovered struct {
	// ID is the id it had before the restart (RenamedFrom is set when
	// the node had to give it a new one).
	ID, RenamedFrom string
	// Len is its length now (the shortest layer), Lens per layer.
	Len  int
	Lens []int
	// Had is its length when the node stopped and LostTokens the tokens
	// of every layer to append again, from position max(Lens), before it
	// decodes as it would have.
	Had, LostTokens int
	Nodes           []string
}

// Damaged is a sequence a restarted node found and could not adopt: a
// node of its grid did not recover it, or its nodes disagree on it (its
// pages were freed), or, with Parked, the adoption failed otherwise (a
// timeout, a node unavailable) and it stays parked on its nodes, to be
// recovered at their next restart.
type Damaged struct {
	ID     string
	Err    string
	Parked bool
}

// Recovered asks the node to recover (it opens the grid of its config)
// and lists the sequences it adopted, and those it found damaged.
func (c *Client) Recovered(ctx context.Context) ([]Recovered, []Damaged, error) {
	r, err := c.api.Recovered(ctx, &decodev1.RecoveredRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("recovered: %w", err)
	}
	var seqs []Recovered
	for _, s := range r.GetSequences() {
		q := Recovered{ID: s.GetSequence(), RenamedFrom: s.GetRenamedFrom(), Len: int(s.GetLength()),
			Had: int(s.GetHad()), LostTokens: int(s.GetLostTokens()), Nodes: s.GetNodes()}
		for _, n := range s.GetLens() {
			q.Lens = append(q.Lens, int(n))
		}
		seqs = append(seqs, q)
	}
	var dmg []Damaged
	for _, d := range r.GetDamaged() {
		dmg = append(dmg, Damaged{ID: d.GetSequence(), Err: d.GetError(), Parked: d.GetParked()})
	}
	return seqs, dmg, nil
}
