package backendtest

import (
	"testing"

	"github.com/questrt/questrt/kernels"
)

// TestModelDeviceTwin runs the model-device suite on the CPU twin.
func TestModelDeviceTwin(t *testing.T) {
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	defer cpu.Close()
	RunModelDevice(t, &QueuedDevice{FakeDevice: FakeDevice{CPU: cpu}})
}
