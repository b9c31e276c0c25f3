package backendtest

import "testing"

// TestPrefillTwin runs the prefill conformance suite on the CPU twin of a
// device (its attention is float64 over float32 pages).
func TestPrefillTwin(t *testing.T) {
	RunPrefill(t, &QueuedDevice{}, []int{32, 64}, 1e-5)
}
