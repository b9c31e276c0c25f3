package kernels

import (
	"fmt"
	"math"
	"slices"
)

// SampleParams are one row's sampling parameters for ModelDevice.Sample.
// The caller draws U (model.Sampler.Params does, from the request's
// seeded stream), so that the device holds no random state and a row
// samples the same token on every device.
type SampleParams struct {
	// Temperature divides the logits before the softmax; 0 is greedy
	// (the first index of the largest logit, as Argmax).
	Temperature float64
	// TopP keeps the smallest set of most likely tokens whose
	// probability reaches it; 0 or 1 keeps every token.
	TopP float64
	// U is the row's uniform draw in [0, 1).
	U float64
}

// Validate reports parameters outside their ranges.
func (p SampleParams) Validate() error {
	switch {
	case !(p.Temperature >= 0) || math.IsInf(p.Temperature, 0):
		return fmt.Errorf("sample: temperature %v (want >= 0)", p.Temperature)
	case !(p.TopP >= 0 && p.TopP <= 1):
		return fmt.Errorf("sample: top-p %v (want 0..1)", p.TopP)
	case !(p.U >= 0 && p.U < 1):
		return fmt.Errorf("sample: uniform draw %v (want [0, 1))", p.U)
	}
	return nil
}

// sampleOne is the mass 1 in the fixed point of the sampling rule.
const sampleOne = 1 << 62

// SampleRow is the sampling rule of ModelDevice.Sample on the host (the
// CPU twin runs it; the CUDA kernel computes the same without a sort):
//
//   - Temperature 0, or a row whose largest logit is +Inf or that has no
//     largest (NaN or -Inf throughout): the first index of the largest
//     logit (0 for none), as Argmax.
//   - Otherwise every token gets the probability p_i = exp((l_i - max) /
//     Temperature) / sum (NaN logits get 0), held as the integer
//     floor(p_i * 2^62), so that the sums below are exact whatever
//     their order (the kernel adds them in parallel).
//   - The tokens in order of logit, largest first, ties by lower index:
//     with 0 < TopP < 1 the kept set is the shortest prefix whose mass
//     reaches floor(TopP * 2^62) (every token when none does); the row's
//     token is the first of that order at which the cumulative mass
//     exceeds floor(U * the kept set's mass).
//
// It is model.Sampler's rule (sequential float64 sums) computed in
// fixed point: the two differ only where a cumulative sum falls within
// about 2^-52 of a boundary.
func SampleRow(logits []float32, p SampleParams) int32 {
	best, idx := float32(math.Inf(-1)), int32(0)
	for i, x := range logits {
		if x > best {
			best, idx = x, int32(i)
		}
	}
	if p.Temperature == 0 || math.IsInf(float64(best), 0) {
		return idx
	}
	m := float64(best)
	var total float64
	for _, x := range logits {
		total += sampleExp(x, m, p.Temperature)
	}
	q := make([]uint64, len(logits))
	order := make([]int32, len(logits))
	var sum uint64
	for i, x := range logits {
		q[i] = uint64(sampleExp(x, m, p.Temperature) / total * sampleOne)
		sum += q[i]
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int {
		if c := sampleKeyCmp(logits[a], logits[b]); c != 0 {
			return c
		}
		return int(a - b)
	})
	// first returns the position in order at which the cumulative mass
	// first exceeds t, and that mass (len(order)-1 and the sum when none).
	first := func(t uint64) (int, uint64) {
		var c uint64
		for j, i := range order {
			c += q[i]
			if c > t {
				return j, c
			}
		}
		return len(order) - 1, c
	}
	kept := sum
	if p.TopP > 0 && p.TopP < 1 {
		tp := max(uint64(p.TopP*sampleOne), 1)
		if tp <= sum {
			_, kept = first(tp - 1)
		}
	}
	t := min(uint64(p.U*float64(kept)), kept-1)
	j, _ := first(t)
	return order[j]
}

// sampleExp is exp((x - m) / temperature), 0 for NaN and -Inf.
func sampleExp(x float32, m, temperature float64) float64 {
	if x != x || math.IsInf(float64(x), -1) {
		return 0
	}
	return math.Exp((float64(x) - m) / temperature)
}

// sampleKeyCmp orders logits largest first (NaN last, as zero mass).
func sampleKeyCmp(a, b float32) int {
	ka, kb := sampleKey(a), sampleKey(b)
	switch {
	case ka > kb:
		return -1
	case ka < kb:
		return 1
	}
	return 0
}

// sampleKey maps a float to an integer of the same order (the kernel's
// radix key): the sign bit flipped for positives, every bit for
// negatives; -0 as +0 (they are equal). NaN maps to 0, below every
// number.
func sampleKey(x float32) uint32 {
	switch {
	case x != x:
		return 0
	case x == 0:
		return 0x80000000
	}
	b := math.Float32bits(x)
	if b&0x80000000 != 0 {
		return ^b
	}
	return b | 0x80000000
}
