package decodetest

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/plan"
)

// Reference is a host reference Stepper: every sequence's keys and values
// in float32 per layer, Quest selection (the min/max bound, group_max or
// per_head, forced sink and local pages, ties to the lower page) and
// attention in float64, one row and head at a time. It is slow and
// independent of the runtime's kernels and shards: the conformance suite
// compares every runner against it.
type Reference struct {
	cfg Config

	mu     sync.Mutex
	open   bool
	seqs   map[decode.SeqID]*refSeq
	nextID decode.SeqID
}

// Config is the geometry and policy of a Stepper under test.
type Config struct {
	Layers int
	plan.Geometry
	// Policy is the selection policy (its page size is the geometry's).
	Policy plan.Policy
}

type refSeq struct {
	k, v [][]float32 // per layer: [tokens][KVHeads][HeadDim]
}

// NewReference returns an empty reference of cfg (selectors Quest and
// Dense).
func NewReference(cfg Config) *Reference {
	cfg.Policy.PageSize = cfg.PageSize
	return &Reference{cfg: cfg, seqs: map[decode.SeqID]*refSeq{}, nextID: 1}
}

// Create adds an empty sequence.
func (r *Reference) Create(context.Context) (decode.SeqID, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := r.nextID
	r.nextID++
	r.seqs[id] = &refSeq{k: make([][]float32, r.cfg.Layers), v: make([][]float32, r.cfg.Layers)}
	return id, nil
}

// Append appends tokens ([n][KVHeads][HeadDim]) to one layer.
func (r *Reference) Append(_ context.Context, id decode.SeqID, layer int, k, v []float32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.seqs[id]
	switch {
	case !ok:
		return fmt.Errorf("%w: unknown sequence %d", decode.ErrBadInput, id)
	case layer < 0 || layer >= r.cfg.Layers || len(k) != len(v) || len(k)%r.cfg.KVRow() != 0:
		return fmt.Errorf("%w: append", decode.ErrBadInput)
	}
	s.k[layer] = append(s.k[layer], k...)
	s.v[layer] = append(s.v[layer], v...)
	return nil
}

// Len returns the tokens of a sequence's last layer.
func (r *Reference) Len(_ context.Context, id decode.SeqID) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.seqs[id]
	if !ok {
		return 0, fmt.Errorf("%w: unknown sequence %d", decode.ErrBadInput, id)
	}
	return len(s.k[r.cfg.Layers-1]) / r.cfg.KVRow(), nil
}

// Begin implements decode.Stepper.
func (r *Reference) Begin(ctx context.Context, b decode.Batch) (decode.Step, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.cfg
	switch {
	case r.open:
		return nil, decode.ErrStepOpen
	case len(b.Rows) == 0 || b.FirstLayer < 0 || b.FirstLayer >= c.Layers || b.Options.Diagnostics:
		return nil, fmt.Errorf("%w: batch", decode.ErrBadInput)
	}
	st := &refStep{r: r, b: b, next: b.FirstLayer, lens: make([]int, len(b.Rows))}
	seen := map[decode.SeqID]bool{}
	for i, row := range b.Rows {
		s, ok := r.seqs[row.Seq]
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: unknown sequence %d", decode.ErrBadInput, row.Seq)
		case seen[row.Seq]:
			return nil, fmt.Errorf("%w: sequence %d twice", decode.ErrBadInput, row.Seq)
		case row.Budget < 0 || (row.Budget > 0 && row.Budget < c.PageSize):
			return nil, fmt.Errorf("%w: budget %d", decode.ErrBadInput, row.Budget)
		case row.DenseLayers < 0 || row.DenseLayers > c.Layers:
			return nil, fmt.Errorf("%w: dense layers %d", decode.ErrBadInput, row.DenseLayers)
		}
		seen[row.Seq] = true
		st.lens[i] = len(s.k[b.FirstLayer]) / c.KVRow()
		if !row.New && st.lens[i] == 0 {
			return nil, fmt.Errorf("%w: sequence %d is empty", decode.ErrBadInput, row.Seq)
		}
	}
	r.open = true
	return st, nil
}

type refStep struct {
	r     *Reference
	b     decode.Batch
	next  int
	lens  []int
	ended bool
}

// Plan returns the reference's page plan of a row at layer for a
// sequence of n tokens (the new one included).
func (r *Reference) Plan(layer, n int, row decode.Row, opt decode.Options) (plan.Plan, error) {
	c := r.cfg
	pl, err := c.Policy.Plan(layer, (n+c.PageSize-1)/c.PageSize, row.Budget)
	if err != nil {
		return plan.Plan{}, fmt.Errorf("%w: %w", decode.ErrBadInput, err)
	}
	if opt.ForceDense || layer < row.DenseLayers {
		pl = pl.AsDense()
	}
	return pl, nil
}

func (st *refStep) Layer(_ context.Context, layer int, q, k, v decode.Tensor, res *decode.Result) error {
	r := st.r
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.cfg
	n := len(st.b.Rows)
	switch {
	case st.ended:
		return decode.ErrStepEnded
	case layer < st.next || layer >= c.Layers:
		return fmt.Errorf("%w: layer %d", decode.ErrBadInput, layer)
	}
	qd, kd, vd, err := decode.HostInputs(q, k, v)
	if err != nil {
		return err
	}
	nNew := st.b.NewRows()
	if len(qd) != n*c.QRow() || len(kd) != nNew*c.KVRow() || len(vd) != len(kd) || !finite(qd) || !finite(kd) || !finite(vd) {
		return fmt.Errorf("%w: shapes or values", decode.ErrBadInput)
	}
	if err := decode.CheckMagnitude("q", qd, c.HeadDim); err != nil {
		return err
	}
	if err := decode.CheckMagnitude("k", kd, c.HeadDim); err != nil {
		return err
	}
	for i, row := range st.b.Rows {
		if got := len(r.seqs[row.Seq].k[layer]) / c.KVRow(); got != st.lens[i] {
			return fmt.Errorf("%w: sequence %d has %d tokens in layer %d, %d at the step's first", decode.ErrBadInput, row.Seq, got, layer, st.lens[i])
		}
	}
	out, err := res.Output(n * c.QRow())
	if err != nil {
		return err
	}
	plans := make([]plan.Plan, n)
	for i, row := range st.b.Rows {
		nt := st.lens[i]
		if row.New {
			nt++
		}
		if plans[i], err = r.Plan(layer, nt, row, st.b.Options); err != nil {
			return err
		}
	}
	st.next = layer + 1
	j := 0
	for _, row := range st.b.Rows {
		if row.New {
			s := r.seqs[row.Seq]
			s.k[layer] = append(s.k[layer], kd[j*c.KVRow():(j+1)*c.KVRow()]...)
			s.v[layer] = append(s.v[layer], vd[j*c.KVRow():(j+1)*c.KVRow()]...)
			j++
		}
	}
	if cap(res.LSE) < n*c.QHeads {
		res.LSE = make([]float32, n*c.QHeads)
	}
	res.LSE = res.LSE[:n*c.QHeads]
	for i, row := range st.b.Rows {
		s := r.seqs[row.Seq]
		r.attend(plans[i], s.k[layer], s.v[layer], qd[i*c.QRow():(i+1)*c.QRow()], out[i*c.QRow():(i+1)*c.QRow()], res.LSE[i*c.QHeads:(i+1)*c.QHeads])
	}
	res.Plans = append(res.Plans[:0], plans...)
	res.Time = decode.Times{}
	return nil
}

func (st *refStep) End(context.Context) error {
	st.r.mu.Lock()
	defer st.r.mu.Unlock()
	if st.ended {
		return decode.ErrStepEnded
	}
	st.ended = true
	st.r.open = false
	return nil
}

// Selected returns, per query head, the pages plan pl attends for the
// query heads q ([QHeads][HeadDim]) over keys k ([tokens][KVHeads][D]):
// every page of a dense plan; else the forced pages and the top Rank
// candidates by the Quest bound (group_max: a KV head's pages by the
// maximum over its query heads; per_head: each query head's own), ties
// to the lower page; ascending.
func (r *Reference) Selected(pl plan.Plan, k, q []float32) [][]int {
	c := r.cfg
	d, g := c.HeadDim, c.QHeads/c.KVHeads
	n := len(k) / c.KVRow()
	bound := func(h, p int) float64 {
		kv := h / g
		var u float64
		for j := range d {
			lo, hi := math.Inf(1), math.Inf(-1)
			for t := p * c.PageSize; t < min((p+1)*c.PageSize, n); t++ {
				x := float64(k[(t*c.KVHeads+kv)*d+j])
				lo, hi = min(lo, x), max(hi, x)
			}
			qj := float64(q[h*d+j])
			u += max(qj*lo, qj*hi)
		}
		return u
	}
	sel := make([][]int, c.QHeads)
	for h := range c.QHeads {
		if pl.Dense {
			for p := range pl.Pages {
				sel[h] = append(sel[h], p)
			}
			continue
		}
		type cand struct {
			p int
			s float64
		}
		var cs []cand
		for p := pl.Lo(); p < pl.Hi(); p++ {
			s := bound(h, p)
			if c.Policy.GQA == plan.GroupMax {
				s = math.Inf(-1)
				for hh := (h / g) * g; hh < (h/g+1)*g; hh++ {
					s = max(s, bound(hh, p))
				}
			}
			cs = append(cs, cand{p, s})
		}
		slices.SortFunc(cs, func(a, b cand) int {
			if a.s != b.s {
				return cmp.Compare(b.s, a.s)
			}
			return cmp.Compare(a.p, b.p)
		})
		for p := range pl.Sink {
			sel[h] = append(sel[h], p)
		}
		for _, x := range cs[:pl.Rank] {
			sel[h] = append(sel[h], x.p)
		}
		for p := pl.Hi(); p < pl.Pages; p++ {
			sel[h] = append(sel[h], p)
		}
		slices.Sort(sel[h])
	}
	return sel
}

// attend writes every query head's attention over the pages pl selects
// into o and its log-sum-exp into lse, in float64.
func (r *Reference) attend(pl plan.Plan, k, v, q, o, lse []float32) {
	c := r.cfg
	d, g := c.HeadDim, c.QHeads/c.KVHeads
	n := len(k) / c.KVRow()
	scale := 1 / math.Sqrt(float64(d))
	for h, pages := range r.Selected(pl, k, q) {
		kv := h / g
		var ws []float64
		var ts []int
		m := math.Inf(-1)
		for _, p := range pages {
			for t := p * c.PageSize; t < min((p+1)*c.PageSize, n); t++ {
				var s float64
				for j := range d {
					s += float64(q[h*d+j]) * float64(k[(t*c.KVHeads+kv)*d+j])
				}
				s *= scale
				ws, ts = append(ws, s), append(ts, t)
				m = max(m, s)
			}
		}
		var sum float64
		acc := make([]float64, d)
		for i, s := range ws {
			e := math.Exp(s - m)
			sum += e
			for j := range d {
				acc[j] += e * float64(v[(ts[i]*c.KVHeads+kv)*d+j])
			}
		}
		for j := range d {
			o[h*d+j] = float32(acc[j] / sum)
		}
		lse[h] = float32(m + math.Log(sum))
	}
}

func finite(x []float32) bool {
	for _, f := range x {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return false
		}
	}
	return true
}
