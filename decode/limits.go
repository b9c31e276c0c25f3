package decode

import (
	"fmt"
	"math"
)

// MagnitudeLimit is the largest |x| a query or key element may have at
// head dimension d: sqrt(MaxFloat32 / (2d)). Then every score q.k and
// every Quest page bound (a sum of d products) stays below MaxFloat32/2,
// so no finite input makes a score, a softmax or a log-sum-exp overflow
// to Inf or NaN in the middle of a step, after its token was appended.
// Every runner refuses larger elements (ErrBadInput) before it changes
// anything.
func MagnitudeLimit(d int) float32 {
	return float32(math.Sqrt(math.MaxFloat32 / (2 * float64(max(d, 1)))))
}

// CheckMagnitude refuses the first element of x over the limit of head
// dimension d (ErrBadInput), naming what x is.
func CheckMagnitude(what string, x []float32, d int) error {
	lim := MagnitudeLimit(d)
	for i, v := range x {
		if v > lim || v < -lim {
			return fmt.Errorf("%w: %s[%d] = %g: beyond %.3g, scores would overflow float32 (head dim %d)", ErrBadInput, what, i, v, lim, d)
		}
	}
	return nil
}
