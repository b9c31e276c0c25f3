package cluster

import (
	"errors"
	"testing"
)

// TestDiscover: on a machine without NVML (CI) Discover reports ErrNoNVML;
// on a GPU host every device has a name, a UUID and memory, and the
// topology matrix is square with "self" on the diagonal.
func TestDiscover(t *testing.T) {
	inv, err := Discover()
	if errors.Is(err, ErrNoNVML) {
		t.Logf("no NVML here: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range inv.GPUs {
		if g.Name == "" || g.UUID == "" || g.MemoryTotal == 0 || g.Index != i {
			t.Errorf("GPU %d incomplete: %+v", i, g)
		}
		if len(inv.Topology[i]) != len(inv.GPUs) || inv.Topology[i][i] != "self" {
			t.Errorf("topology row %d: %v", i, inv.Topology[i])
		}
	}
}
