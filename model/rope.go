package model

import "math"

// rope holds the inverse frequencies of rotary position embedding in
// Hugging Face's rotate-half convention: dimension i < D/2 pairs with
// i + D/2 and turns by pos * invFreq[i].
type rope struct {
	invFreq []float64
}

func newRope(c Config) *rope {
	d := c.HeadDim
	inv := make([]float64, d/2)
	for i := range inv {
		// float32 like transformers' inv_freq buffer.
		inv[i] = float64(float32(1 / math.Pow(c.RopeTheta, float64(float32(2*i)/float32(d)))))
	}
	if r := c.RopeScaling; r != nil && r.Kind() == "llama3" {
		// Llama 3.1: keep high frequencies, divide low ones by factor,
		// interpolate in between (transformers' _compute_llama3_parameters).
		old := float64(r.OriginalMaxPositions)
		lowWave, highWave := old/r.LowFreqFactor, old/r.HighFreqFactor
		for i, f := range inv {
			wave := 2 * math.Pi / f
			switch {
			case wave < highWave:
			case wave > lowWave:
				inv[i] = f / r.Factor
			default:
				s := (old/wave - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
				inv[i] = (1-s)*f/r.Factor + s*f
			}
		}
	}
	return &rope{invFreq: inv}
}

// apply rotates n tokens of x ([n][heads][D]) at positions pos0..pos0+n-1.
func (r *rope) apply(x []float32, n, heads, pos0 int) {
	half := len(r.invFreq)
	d := 2 * half
	cs := make([]float32, 0, 2*half)
	for t := range n {
		cs = r.cosSin(cs[:0], pos0+t)
		for h := range heads {
			v := x[(t*heads+h)*d : (t*heads+h+1)*d]
			for i := range half {
				c, s := cs[2*i], cs[2*i+1]
				a, b := v[i], v[i+half]
				v[i] = a*c - b*s
				v[i+half] = b*c + a*s
			}
		}
	}
}

// cosSin appends the cosine and sine of each angle at position p:
// [D/2][2]. The angle is rounded to float32 as transformers computes it
// (position times inv_freq in float32): the model was trained with that
// rounding, and keeping it takes the logit error against the reference
// from 5e-4 to 3e-5 at position 1000.
func (r *rope) cosSin(cs []float32, p int) []float32 {
	pos := float32(p)
	for _, f := range r.invFreq {
		s, c := math.Sincos(float64(pos * float32(f)))
		cs = append(cs, float32(c), float32(s))
	}
	return cs
}
