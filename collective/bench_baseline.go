package collective

import "context"

// The baseline of the benchmark: the same ranks, transport and bytes per
// message as the collective operations, moved as plain rounds of opaque
// bytes (no encoding, no checks, no merge), so a result can say how much
// of an operation's latency is the operation and how much the transport.

// Ops of the baseline rounds, used only in tags (the Group's operations
// use OpSelect and OpReduce), so that a round and its barrier never share
// a tag with an operation.
const (
	opBaseGather Op = 16 // the all-gather of select-frame-sized messages
	opBaseRoot   Op = 17 // the gather to rank 0 of state-frame-sized messages
	opPingPong   Op = 18 // the ping-pong of ranks 0 and 1
	opSweep      Op = 19 // BenchSweep's all-gather
)

// selectFrameLen is the length of the frame SelectExact sends for the
// candidates local (see Group.encodeSelect): a header, a count per row
// and 8 bytes per candidate.
func selectFrameLen(local [][]Candidate) int {
	n := selectHeaderLen + 4*len(local)
	for _, c := range local {
		n += candidateLen * len(c)
	}
	return n
}

// stateFrameLen is the length of the frame Reduce sends for states
// partial states of d floats (see Group.encodeState).
func stateFrameLen(states, d int) int {
	return stateHeaderLen + 4*states*(d+1)
}

// plainAllGather sends msg to every other member of t (rank+1 first, as
// Group's exchange does) and then receives one message from each of them
// under tag, keeping none: an all-gather of opaque bytes.
func plainAllGather(ctx context.Context, t Transport, tag uint64, msg []byte) error {
	n, me := t.Size(), t.Rank()
	for i := 1; i < n; i++ {
		r := (me + i) % n
		if err := t.Send(ctx, r, tag, msg); err != nil {
			return &RankError{Rank: r, Err: err}
		}
	}
	for r := range n {
		if r == me {
			continue
		}
		if _, err := t.Recv(ctx, r, tag); err != nil {
			return &RankError{Rank: r, Err: err}
		}
	}
	return nil
}

// plainGather sends msg to rank 0 from every other member; rank 0
// receives one message from each: the traffic of Reduce to rank 0 as
// opaque bytes.
func plainGather(ctx context.Context, t Transport, tag uint64, msg []byte) error {
	if t.Rank() != 0 {
		if err := t.Send(ctx, 0, tag, msg); err != nil {
			return &RankError{Rank: 0, Err: err}
		}
		return nil
	}
	for r := 1; r < t.Size(); r++ {
		if _, err := t.Recv(ctx, r, tag); err != nil {
			return &RankError{Rank: r, Err: err}
		}
	}
	return nil
}

// pingPong is one round trip of msg between ranks 0 and 1 over their
// stream: rank 0 sends it, rank 1 sends back what it received. The other
// ranks (and a group of one) do nothing.
func pingPong(ctx context.Context, t Transport, tag uint64, msg []byte) error {
	switch t.Rank() {
	case 0:
		if t.Size() < 2 {
			return nil
		}
		if err := t.Send(ctx, 1, tag, msg); err != nil {
			return &RankError{Rank: 1, Err: err}
		}
		if _, err := t.Recv(ctx, 1, tag); err != nil {
			return &RankError{Rank: 1, Err: err}
		}
	case 1:
		b, err := t.Recv(ctx, 0, tag)
		if err != nil {
			return &RankError{Rank: 0, Err: err}
		}
		if err := t.Send(ctx, 0, tag, b); err != nil {
			return &RankError{Rank: 0, Err: err}
		}
	}
	return nil
}
