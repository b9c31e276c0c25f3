//go:build cuda

package cuda

import (
	"fmt"
	"time"

	"gorgonia.org/cu"
)

// stepProbe records, for benchmarks, a host clock reading and a CUDA event
// at marks in each Step: 0 where the call starts its device work, 1 after
// the upload (prepareAttend), 2 after the kernel launches, 3 after the
// download; plus the host time at the Step's entry (entered). done adds
// each interval of the step (microseconds) to Host[i] (entry to mark 0,
// then mark i-1 to mark i) and GPU[i] (event i to event i+1). A nil probe
// records nothing.
type stepProbe struct {
	ev      [probeMarks]cu.Event
	at      [probeMarks]time.Time
	entered time.Time
	Host    [probeMarks][]float64
	GPU     [probeMarks - 1][]float64
}

const probeMarks = 4

func newStepProbe() (*stepProbe, error) {
	p := &stepProbe{}
	for i := range p.ev {
		var err error
		if p.ev[i], err = cu.MakeEvent(cu.DefaultEvent); err != nil {
			return nil, fmt.Errorf("cuda: probe event: %w", err)
		}
	}
	return p, nil
}

func (p *stepProbe) enter() {
	if p != nil {
		p.entered = time.Now()
	}
}

func (p *stepProbe) mark(i int) error {
	if p == nil {
		return nil
	}
	p.at[i] = time.Now()
	return p.ev[i].Record(cu.Stream{})
}

func (p *stepProbe) done() error {
	if p == nil {
		return nil
	}
	if err := p.mark(probeMarks - 1); err != nil {
		return err
	}
	if err := p.ev[probeMarks-1].Synchronize(); err != nil {
		return err
	}
	prev := p.entered
	for i := range p.at {
		p.Host[i] = append(p.Host[i], float64(p.at[i].Sub(prev).Nanoseconds())/1e3)
		prev = p.at[i]
	}
	for i := range p.GPU {
		ms, err := p.ev[i].Elapsed(p.ev[i+1])
		if err != nil {
			return err
		}
		p.GPU[i] = append(p.GPU[i], ms*1e3)
	}
	return nil
}

func (p *stepProbe) destroy() {
	for i := range p.ev {
		cu.DestroyEvent(&p.ev[i])
	}
}
