//go:build cuda

package cuda

import (
	"context"
	"fmt"

	"gorgonia.org/cu"
)

// Phase marks: CUDA events queued on the default stream between the
// phases of a step (model/gpu's PhaseMarker), so that a benchmark can
// split a step's device timeline into projections, attention and the
// rest. An event recorded between two kernels also ends a programmatic
// dependent launch's overlap there, so a marked step is not a timed one.

// maxMarks bounds the events queued between two PhaseTimes calls.
const maxMarks = 1 << 14

// MarkPhase queues a CUDA event on the default stream after the work
// queued so far.
func (b *Backend) MarkPhase(ctx context.Context) error {
	return b.do(ctx, func() error {
		if len(b.marks) >= maxMarks {
			return fmt.Errorf("cuda: %d phase marks queued without PhaseTimes", len(b.marks))
		}
		ev, err := cu.MakeEvent(cu.DefaultEvent)
		if err != nil {
			return fmt.Errorf("cuda: phase mark: %w", err)
		}
		if err := ev.Record(cu.Stream{}); err != nil {
			cu.DestroyEvent(&ev)
			return fmt.Errorf("cuda: phase mark: %w", err)
		}
		b.marks = append(b.marks, ev)
		return nil
	})
}

// PhaseTimes waits for the marks queued since the last call and returns
// the milliseconds between consecutive ones (one fewer than the marks),
// then forgets them.
func (b *Backend) PhaseTimes(ctx context.Context) ([]float64, error) {
	var out []float64
	err := b.do(context.WithoutCancel(ctx), func() error {
		defer func() {
			for i := range b.marks {
				cu.DestroyEvent(&b.marks[i])
			}
			b.marks = b.marks[:0]
		}()
		if len(b.marks) == 0 {
			return nil
		}
		if err := b.marks[len(b.marks)-1].Synchronize(); err != nil {
			return fmt.Errorf("cuda: phase marks: %w", err)
		}
		out = make([]float64, 0, len(b.marks)-1)
		for i := 1; i < len(b.marks); i++ {
			ms, err := b.marks[i-1].Elapsed(b.marks[i])
			if err != nil {
				return fmt.Errorf("cuda: phase marks %d..%d: %w", i-1, i, err)
			}
			out = append(out, ms)
		}
		return nil
	})
	return out, err
}
