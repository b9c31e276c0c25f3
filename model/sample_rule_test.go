package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/kernels"
)

// TestSamplerParamsMatchSampleRow: a sampler's Params (the draw it
// would use) given to kernels.SampleRow, the devices' fixed-point rule,
// picks the token its Sample picks, over random rows with ties and -Inf,
// at several temperatures and top-p; two samplers of one seed stay in
// step (Params draws exactly what Sample draws, nothing when greedy).
func TestSamplerParamsMatchSampleRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, v := range []int{1, 3, 260, 5000} {
		for _, temp := range []float64{0, 0.3, 0.8, 1, 2} {
			for _, topP := range []float64{0, 0.5, 0.9, 1} {
				a, err := NewSampler(temp, topP, uint64(v)+7)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := NewSampler(temp, topP, uint64(v)+7)
				for n := range 25 {
					row := make([]float32, v)
					for i := range row {
						row[i] = float32(rng.NormFloat64() * 3)
						if n%3 == 1 {
							row[i] = float32(math.Round(float64(row[i])))
						}
					}
					if v > 2 && n%4 == 0 {
						row[rng.IntN(v)] = float32(math.Inf(-1))
					}
					want := a.Sample(row)
					p := b.Params()
					if got := kernels.SampleRow(row, p); int(got) != want {
						t.Fatalf("vocab %d T %v top-p %v row %d %v: SampleRow %d, Sample %d (u %v)", v, temp, topP, n, row, got, want, p.U)
					}
				}
			}
		}
	}
}
