package gpu

import (
	"context"
	"fmt"
)

// PhaseMarker is a device that queues timestamps between the phases of a
// step and reads back the time between them (the CUDA backend: events
// on its stream). A marked step is a measurement of where the device's
// time goes, not a timed step: a mark between two kernels ends a
// programmatic dependent launch's overlap there.
type PhaseMarker interface {
	// MarkPhase queues a mark after the work queued so far.
	MarkPhase(ctx context.Context) error
	// PhaseTimes waits for the marks queued since the last call and
	// returns the milliseconds between consecutive ones, then forgets
	// them.
	PhaseTimes(ctx context.Context) ([]float64, error)
}

// Phases is the device timeline of one marked Decode in milliseconds,
// summed over the layers (Executor.MarkPhases).
type Phases struct {
	// In is each layer's normalised q|k|v projection and RoPE.
	In float64 `json:"in"`
	// Attention is each layer's engine step (the new K/V appended, the
	// Quest or dense attention, and any time the device waited for the
	// host to queue it).
	Attention float64 `json:"attention"`
	// Out is each layer's o projection, normalised gate|up projection,
	// SiLU and down projection.
	Out float64 `json:"out"`
	// EndGap is the time from the last layer's work to the head's: the
	// host's end of the step (its synchronisation) with the device idle.
	EndGap float64 `json:"end_gap"`
	// Head is the final norm and the LM head's projection.
	Head float64 `json:"head"`
}

// PrefillPhases is the device timeline of one marked Prefill in
// milliseconds, summed over its chunks and layers (Executor.MarkPhases).
type PrefillPhases struct {
	// In is each layer's normalised q|k|v projection (GEMMs) and RoPE.
	In float64 `json:"in"`
	// Attention is each layer's PrefillTensor: the chunk's keys and
	// values appended to the pages and its causal attention over the
	// sequence.
	Attention float64 `json:"attention"`
	// Out is each layer's o projection, normalised gate|up projection,
	// SiLU and down projection.
	Out float64 `json:"out"`
}

// MarkPhases turns marks between the phases of every Decode and Prefill
// on or off (LastPhases and LastPrefillPhases read them); a device that
// is not a PhaseMarker is refused with ErrBadInput.
func (x *Executor) MarkPhases(on bool) error {
	if !on {
		x.marker = nil
		return nil
	}
	m, ok := x.be.(PhaseMarker)
	if !ok {
		return fmt.Errorf("%w: the device has no phase marks (the CUDA backend has)", ErrBadInput)
	}
	x.marker = m
	return nil
}

// LastPhases is the device timeline of the last successful Decode with
// marks on (the zero Phases when they were off).
func (x *Executor) LastPhases() Phases { return x.phases }

// LastPrefillPhases is the device timeline of the last successful
// Prefill with marks on (the zero PrefillPhases when they were off).
func (x *Executor) LastPrefillPhases() PrefillPhases { return x.prePhases }

// LayerWeightBytes is the bytes of the decoder layers' weights (norms and
// projections, without the embedding and the head): what In and Out
// stream once per step.
func (x *Executor) LayerWeightBytes() int64 {
	var n int64
	for i := range x.layers {
		for _, m := range x.layers[i].matrices() {
			n += m.Bytes()
		}
	}
	return n
}

// mark queues a phase mark when marks are on.
func (x *Executor) mark(ctx context.Context) error {
	if x.marker == nil {
		return nil
	}
	return x.marker.MarkPhase(ctx)
}

// readPhases reads the marks of a Decode over layers layers: one before
// the first layer, three per layer (after In, Attention, Out), one
// before and one after the head.
func (x *Executor) readPhases(ctx context.Context, layers int) error {
	if x.marker == nil {
		x.phases = Phases{}
		return nil
	}
	ts, err := x.marker.PhaseTimes(ctx)
	if err != nil {
		return err
	}
	if len(ts) != 3*layers+2 {
		return fmt.Errorf("gpu: %d phase intervals, want %d", len(ts), 3*layers+2)
	}
	var p Phases
	p.In, p.Attention, p.Out = sumLayers(ts, layers)
	p.EndGap, p.Head = ts[3*layers], ts[3*layers+1]
	x.phases = p
	return nil
}

// addChunkPhases reads the marks of one Prefill chunk over layers layers
// (one before the first layer, three per layer: after In, Attention,
// Out) and adds them to p. A chunk's marks are read before the next
// chunk's are queued, so a prompt of any length stays within the
// device's bound on queued marks.
func (x *Executor) addChunkPhases(ctx context.Context, layers int, p *PrefillPhases) error {
	ts, err := x.marker.PhaseTimes(ctx)
	if err != nil {
		return err
	}
	if len(ts) != 3*layers {
		return fmt.Errorf("gpu: %d prefill phase intervals, want %d", len(ts), 3*layers)
	}
	in, attn, out := sumLayers(ts, layers)
	p.In += in
	p.Attention += attn
	p.Out += out
	return nil
}

// sumLayers sums the first 3 layers intervals of ts, each layer's In,
// Attention and Out in turn, per phase.
func sumLayers(ts []float64, layers int) (in, attn, out float64) {
	for l := range layers {
		in += ts[3*l]
		attn += ts[3*l+1]
		out += ts[3*l+2]
	}
	return in, attn, out
}
