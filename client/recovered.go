package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	// Lost are, per layer, the tokens that layer lacks of what it held
	// when the node stopped (Had - Lens[layer] where the nodes report
	// one length); RolledBack, when not nil, per layer, those of them
	// an interrupted decode step had appended (a kill inside a step):
	// never acknowledged to a client. Lost[l] - RolledBack[l] are the
	// acknowledged tokens to append again to layer l from Lens[l].
	Lost, RolledBack []int
	// LostExact says per layer whether Lost[l] is exact; otherwise Lost[l]
	// is an upper bound (a node killed inside a step estimates a layer
	// it had no record of from its longest layer: one token too many
	// where the step did not reach the layer). nil from a node that
	// does not say: every count an upper bound. Lens are exact either
	// way: a client appends again, from Lens[l], the acknowledged
	// tokens it holds past it.
	LostExact []bool
	Nodes     []string
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
	// Reason, when not empty, is what a node of its grid reported of it,
	// "node <name>: ..." (Err includes it): why that node did not
	// recover it (its pages failed their checks, or the grid's data
	// directory there was damaged and moved aside).
	Reason string
}

// Recovered asks the node to recover (it opens the grid of its config)
// and lists the sequences it adopted, and those it found damaged. The
// node waits for its recovery to finish (bounded: questd answers
// UNAVAILABLE, saying to retry, when it is still going on); Recovered
// asks again with backoff while the node answers UNAVAILABLE, up to
// Options.RecoveredAttempts calls and within ctx.
func (c *Client) Recovered(ctx context.Context) ([]Recovered, []Damaged, error) {
	r, err := c.recovered(ctx)
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
		for _, n := range s.GetLost() {
			q.Lost = append(q.Lost, int(n))
		}
		for _, n := range s.GetRolledBack() {
			q.RolledBack = append(q.RolledBack, int(n))
		}
		if e := s.GetLostExact(); len(e) == len(q.Lost) && len(e) > 0 {
			q.LostExact = e
		}
		seqs = append(seqs, q)
	}
	var dmg []Damaged
	for _, d := range r.GetDamaged() {
		dmg = append(dmg, Damaged{ID: d.GetSequence(), Err: d.GetError(), Parked: d.GetParked(), Reason: d.GetReason()})
	}
	return seqs, dmg, nil
}

// Backoff between the calls of Recovered.
const (
	recoveredBackoff    = 100 * time.Millisecond
	recoveredMaxBackoff = 2 * time.Second
)

// recovered calls the Recovered API, again after a pause while the node
// answers UNAVAILABLE (c.attempts calls at most, within ctx).
func (c *Client) recovered(ctx context.Context) (*decodev1.RecoveredReply, error) {
	backoff := recoveredBackoff
	for attempt := 1; ; attempt++ {
		r, err := c.api.Recovered(ctx, &decodev1.RecoveredRequest{})
		if err == nil || attempt >= c.attempts || status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return r, err
		}
		pause := max(backoff, retryDelay(err))
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (after %d calls; the last: %w)", context.Cause(ctx), attempt, err)
		}
		backoff = min(2*backoff, recoveredMaxBackoff)
	}
}

// retryDelay is the pause err's RetryInfo asks for (0 for none), at most
// recoveredMaxBackoff.
func retryDelay(err error) time.Duration {
	st, ok := status.FromError(err)
	if !ok {
		return 0
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return min(max(ri.GetRetryDelay().AsDuration(), 0), recoveredMaxBackoff)
		}
	}
	return 0
}
