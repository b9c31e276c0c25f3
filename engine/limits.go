package engine

import "github.com/questrt/questrt/decode"

// MagnitudeLimit is decode.MagnitudeLimit: the largest |x| a query or
// key element may have at head dimension d.
func MagnitudeLimit(d int) float32 { return decode.MagnitudeLimit(d) }

// checkMagnitude refuses the first element of x over the limit of head
// dimension d, naming what x is (decode.CheckMagnitude).
func checkMagnitude(what string, x []float32, d int) error { return decode.CheckMagnitude(what, x, d) }
