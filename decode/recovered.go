package decode

import "slices"

// Recovered describes the lengths of a sequence recovered from a data
// directory after a restart, as a worker reports it and an engine adopts
// it: the tokens each layer holds now, those it held when its node
// stopped, and which of those it cut as the appends of an interrupted
// step. The worker (worker.RecoveredSeq), the engine's view of one
// worker's part (engine.RecoveredPart) and the wire between them
// (worker/remote) carry it as it is; each adds only how it names the
// sequence.
type Recovered struct {
	// Lens are the recovered lengths per layer, in global tokens: the
	// position just past the last token the reporting ranks hold in
	// that layer (a worker hosting only some CP ranks reports the end
	// of its own). Layers may differ.
	Lens []int
	// RolledBack, when not nil, are per layer the tokens recovery cut
	// because the step that appended them had not ended when the node
	// stopped: never acknowledged to a client. They are counted in Had
	// as well.
	RolledBack []int
	// Had is the sequence's length when the node stopped, as far as the
	// reporting ranks know; Had - max(Lens) tokens are to be appended
	// again from position max(Lens).
	Had int
	// HadLens, when not nil, are per layer the length the layer held
	// when the node stopped (Had is at least their largest); nil when
	// unknown, Had standing for every layer then.
	HadLens []int
	// HadExact, when not nil, says per layer whether HadLens[l] is exact
	// (else an upper bound); nil: every one an upper bound.
	HadExact []bool
}

// Len is the shortest layer's length.
func (r Recovered) Len() int { return slices.Min(r.Lens) }

// LostTokens is Had - max(Lens), or 0 where no layer lost a token: the
// tokens of every layer to append again, from position max(Lens),
// before the sequence decodes as it would have.
func (r Recovered) LostTokens() int {
	hi := 0
	if len(r.Lens) > 0 {
		hi = slices.Max(r.Lens)
	}
	return max(r.Had-hi, 0)
}

// Lost are, per layer, the tokens the layer lacks of what it held when
// its node stopped: HadLens[l] - Lens[l], or Had - Lens[l] where HadLens
// is nil (an upper bound where the layers were uneven at the stop); 0
// where the layer holds as much. Lost[l] - RolledBack[l] are the
// acknowledged tokens to append again to layer l from Lens[l].
func (r Recovered) Lost() []int {
	out := make([]int, len(r.Lens))
	for l, n := range r.Lens {
		h := r.Had
		if r.HadLens != nil {
			h = r.HadLens[l]
		}
		out[l] = max(h-n, 0)
	}
	return out
}

// LostExact says per layer whether Lost()[l] is exact (HadExact: the
// lengths now are exact, so the loss is as exact as HadLens); nil: every
// one an upper bound.
func (r Recovered) LostExact() []bool { return r.HadExact }
