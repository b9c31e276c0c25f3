package cluster

import (
	"errors"
	"fmt"
)

// GPU is one device as NVML reports it: what a node advertises in its
// membership metadata.
type GPU struct {
	Index       int    `json:"index"`
	Name        string `json:"name"`
	UUID        string `json:"uuid"`
	PCIBusID    string `json:"pci_bus_id"`
	MemoryTotal uint64 `json:"memory_total_bytes"`
	MemoryFree  uint64 `json:"memory_free_bytes"`
	// NVLinks is the number of active NVLink links.
	NVLinks int `json:"nvlinks"`
}

// Inventory is the GPUs of this node and how they connect.
type Inventory struct {
	Driver string `json:"driver"`
	GPUs   []GPU  `json:"gpus"`
	// Topology[i][j] names the closest common ancestor of GPUs i and j
	// (nvml's GpuTopologyLevel: "internal", "single", "multiple",
	// "hostbridge", "node", "system").
	Topology [][]string `json:"topology"`
}

// ErrNoNVML means NVML (the NVIDIA driver's management library) is absent
// or has no usable device: the node runs on CPU.
var ErrNoNVML = errors.New("cluster: no NVML or no NVIDIA GPU")

// ErrNoDiscovery means this binary was built without GPU discovery: the
// default build is pure Go (no cgo), and go-nvml needs cgo. It wraps
// [ErrNoNVML], so callers that fall back to the CPU on ErrNoNVML keep
// doing so.
var ErrNoDiscovery = fmt.Errorf("%w: this build has no GPU discovery (build with -tags nvml or -tags cuda, which need cgo)", ErrNoNVML)

// Discover lists the node's GPUs. In builds with the nvml or cuda tag it
// asks NVML through go-nvml and, without NVML (no NVIDIA driver), returns
// an error wrapping [ErrNoNVML]; in the default build it returns
// [ErrNoDiscovery].
func Discover() (Inventory, error) { return discover() }
