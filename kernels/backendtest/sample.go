package backendtest

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
)

// testSample checks ModelDevice.Sample against two references that do
// not share its code: refSample (the tokens sorted, float64 sums in
// order, as model.Sampler samples) on random rows, and probabilities
// computed here from math.Exp, which uniform draws on a grid must
// reproduce as the inverse of the cumulative distribution.
func testSample(t *testing.T, dev kernels.ModelDevice) {
	t.Run("MatchesSampler", func(t *testing.T) { testSampleMatchesSampler(t, dev) })
	t.Run("Distribution", func(t *testing.T) { testSampleDistribution(t, dev) })
	t.Run("Edges", func(t *testing.T) { testSampleEdges(t, dev) })
	t.Run("BadInput", func(t *testing.T) { testSampleBadInput(t, dev) })
}

func sampleOn(t *testing.T, dev kernels.ModelDevice, logits []float32, v int, ps []kernels.SampleParams) []int32 {
	t.Helper()
	got, greedy, err := dev.Sample(context.Background(), upload(t, dev, logits), len(ps), v, ps)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ps) || len(greedy) != len(ps) {
		t.Fatalf("%d rows: %d tokens and %d argmaxes", len(ps), len(got), len(greedy))
	}
	for r := range ps {
		if want := refArgmax(logits[r*v : (r+1)*v]); int(greedy[r]) != want {
			t.Fatalf("row %d: argmax %d, want %d", r, greedy[r], want)
		}
	}
	return got
}

func testSampleMatchesSampler(t *testing.T, dev kernels.ModelDevice) {
	rng := rand.New(rand.NewPCG(7, 11))
	temps := []float64{0, 0.25, 0.7, 1, 1.7}
	topPs := []float64{0, 0.3, 0.9, 0.95, 1}
	for _, v := range []int{1, 2, 7, 300, 3001, 40000, 128256} {
		rows := 40
		if v >= 40000 {
			rows = 6
		}
		logits := make([]float32, rows*v)
		ps := make([]kernels.SampleParams, rows)
		for r := range rows {
			row := logits[r*v : (r+1)*v]
			sigma := []float64{0.5, 2, 8}[r%3]
			for i := range row {
				x := rng.NormFloat64() * sigma
				if r%4 == 1 {
					x = math.Round(x*2) / 2 // many ties
				}
				row[i] = float32(x)
			}
			if r%5 == 2 && v > 2 {
				row[rng.IntN(v)] = float32(math.Inf(-1))
			}
			ps[r] = kernels.SampleParams{Temperature: temps[r%len(temps)], TopP: topPs[(r/len(temps))%len(topPs)], U: rng.Float64()}
		}
		got := sampleOn(t, dev, logits, v, ps)
		for r, p := range ps {
			row := logits[r*v : (r+1)*v]
			want := refArgmax(row)
			if p.Temperature != 0 {
				want = refSample(row, p)
			}
			if int(got[r]) != want {
				t.Errorf("vocab %d row %d %+v: token %d, the float64 reference %d", v, r, p, got[r], want)
			}
		}
	}
}

// testSampleDistribution draws u on a grid of n points: the share of each
// token must be its probability (renormalised over the nucleus) within
// one grid step, since the rule inverts the cumulative distribution.
func testSampleDistribution(t *testing.T, dev kernels.ModelDevice) {
	const n = 4000
	inf := float32(math.Inf(-1))
	base := []float32{2, 1, 1, 0, inf, 0.5}
	v := len(base)
	for _, c := range []struct {
		temp, topP float64
		kept       []int // the nucleus, most likely first
	}{
		{1, 0, []int{0, 1, 2, 5, 3}},
		{1, 0.8, []int{0, 1, 2}}, // 0.4775 + 0.1757 + 0.1757 >= 0.8
		{0.5, 0.9, []int{0, 1, 2}},
		{3, 1, []int{0, 1, 2, 5, 3}},
	} {
		var sum float64
		p := make([]float64, v)
		for _, i := range c.kept {
			p[i] = math.Exp(float64(base[i]) / c.temp)
			sum += p[i]
		}
		logits := make([]float32, n*v)
		ps := make([]kernels.SampleParams, n)
		for k := range n {
			copy(logits[k*v:], base)
			ps[k] = kernels.SampleParams{Temperature: c.temp, TopP: c.topP, U: (float64(k) + 0.5) / n}
		}
		got := sampleOn(t, dev, logits, v, ps)
		count := make([]int, v)
		for k, id := range got {
			count[id]++
			if k > 0 && pos(c.kept, int(id)) < pos(c.kept, int(got[k-1])) {
				t.Fatalf("T %v top-p %v: draw %d picked %d after %d: not monotone in u", c.temp, c.topP, k, id, got[k-1])
			}
		}
		for i := range v {
			if want := p[i] / sum * n; math.Abs(float64(count[i])-want) > 1 {
				t.Errorf("T %v top-p %v: token %d drawn %d times of %d, want %.2f", c.temp, c.topP, i, count[i], n, want)
			}
		}
	}
}

// refSample is the rule in float64 with sequential sums over the sorted
// tokens (as model.Sampler computes it; finite logits and -Inf).
func refSample(row []float32, p kernels.SampleParams) int {
	idx := make([]int, len(row))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case row[a] > row[b]:
			return -1
		case row[a] < row[b]:
			return 1
		}
		return 0
	})
	m := float64(row[idx[0]])
	e := make([]float64, len(idx))
	var sum float64
	for j, i := range idx {
		e[j] = math.Exp((float64(row[i]) - m) / p.Temperature)
		sum += e[j]
	}
	keep := len(idx)
	if p.TopP > 0 && p.TopP < 1 {
		var c float64
		for j := range e {
			if c += e[j] / sum; c >= p.TopP {
				keep = j + 1
				break
			}
		}
		sum = 0
		for _, x := range e[:keep] {
			sum += x
		}
	}
	u := p.U * sum
	for j := range keep {
		if u -= e[j]; u < 0 {
			return idx[j]
		}
	}
	return idx[keep-1]
}

// refArgmax is the first index of the largest value that is not NaN (0
// for none), as ModelDevice.Argmax states.
func refArgmax(row []float32) int {
	best, at := math.Inf(-1), 0
	for i, x := range row {
		if float64(x) > best {
			best, at = float64(x), i
		}
	}
	return at
}

func pos(s []int, x int) int {
	for i, y := range s {
		if y == x {
			return i
		}
	}
	return len(s)
}

func testSampleEdges(t *testing.T, dev kernels.ModelDevice) {
	nan, ninf, pinf := float32(math.NaN()), float32(math.Inf(-1)), float32(math.Inf(1))
	negZero := float32(math.Copysign(0, -1))
	// Equal logits: u in the k-th of v equal parts picks token k (ties in
	// index order, uniform).
	const v = 1000
	eq := make([]float32, v*v)
	ps := make([]kernels.SampleParams, v)
	for k := range v {
		ps[k] = kernels.SampleParams{Temperature: 1, U: (float64(k) + 0.5) / v}
	}
	for k, id := range sampleOn(t, dev, eq, v, ps) {
		if int(id) != k {
			t.Fatalf("equal logits, u = %v: token %d, want %d", ps[k].U, id, k)
		}
	}
	const w = 9
	rows := [][]float32{
		{0, 1, 3, 3, 2, 1, 0, -1, 3},                                // greedy: the first 3
		{0, 1, pinf, 3, pinf, 1, 0, -1, 3},                          // +Inf: the first, whatever T
		{ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf},      // none: 0
		{nan, nan, nan, nan, nan, nan, nan, nan, nan},               // none: 0
		{nan, 0, nan, 0, nan, 0, nan, 0, nan},                       // NaN is never drawn
		{0, 5, 0, 0, 0, 0, 0, 0, 0},                                 // tiny top-p keeps the argmax only
		{9, 0, 0, 0, 0, 0, 0, 0, 8},                                 // u just below 1 takes the last kept
		{-1e30, -1e30, -1e30, 4, -1e30, -1e30, -1e30, -1e30, -1e30}, // mass in one token
		{negZero, -30, 0, -30, -30, -30, -30, -30, -30},             // -0 and +0 tie: index order
	}
	ps = []kernels.SampleParams{
		{Temperature: 0, U: 0.9},
		{Temperature: 1, U: 0.7},
		{Temperature: 1, U: 0.5},
		{Temperature: 1, U: 0.5},
		{Temperature: 1, U: 0.999},
		{Temperature: 100, TopP: 1e-9, U: 0.99},
		{Temperature: 1, TopP: 0.99, U: 0.999999},
		{Temperature: 2, U: 0.999},
		{Temperature: 1, U: 0.4},
	}
	want := []int32{2, 2, 0, 0, 7, 1, 8, 3, 0}
	var flat []float32
	for _, r := range rows {
		if len(r) != w {
			t.Fatalf("test row of %d", len(r))
		}
		flat = append(flat, r...)
	}
	got := sampleOn(t, dev, flat, w, ps)
	for r := range want {
		if got[r] != want[r] {
			t.Errorf("row %d %v %+v: token %d, want %d", r, rows[r], ps[r], got[r], want[r])
		}
	}
}

func testSampleBadInput(t *testing.T, dev kernels.ModelDevice) {
	ctx := context.Background()
	lt := upload(t, dev, make([]float32, 2*5))
	for _, ps := range [][]kernels.SampleParams{
		{{Temperature: 1}},                    // one set for two rows
		{{Temperature: 1}, {Temperature: -1}}, // temperature
		{{Temperature: 1}, {TopP: 1.5}},       // top-p
		{{Temperature: 1}, {Temperature: 1, U: 1}},
		{{Temperature: 1}, {Temperature: math.NaN()}},
	} {
		if _, _, err := dev.Sample(ctx, lt, 2, 5, ps); err == nil {
			t.Errorf("%+v: sampled", ps)
		}
	}
	if _, _, err := dev.Sample(ctx, lt, 3, 5, make([]kernels.SampleParams, 3)); err == nil {
		t.Error("3 rows of 5 in a tensor of 10: sampled")
	}
}
