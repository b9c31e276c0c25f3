package cluster

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
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

// Discover lists the node's GPUs through go-nvml. Without NVML (no NVIDIA
// driver) it returns an error wrapping ErrNoNVML.
func Discover() (Inventory, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return Inventory{}, fmt.Errorf("%w: nvml init: %s", ErrNoNVML, nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	var inv Inventory
	if v, ret := nvml.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		inv.Driver = v
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return inv, fmt.Errorf("%w: device count: %s", ErrNoNVML, nvml.ErrorString(ret))
	}
	if n == 0 {
		return inv, fmt.Errorf("%w: NVML sees 0 devices", ErrNoNVML)
	}
	devs := make([]nvml.Device, n)
	for i := range n {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return inv, fmt.Errorf("cluster: device %d: %s", i, nvml.ErrorString(ret))
		}
		devs[i] = d
		g := GPU{Index: i}
		g.Name, _ = d.GetName()
		g.UUID, _ = d.GetUUID()
		if pci, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
			g.PCIBusID = cString(pci.BusId[:])
		}
		if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryTotal, g.MemoryFree = mem.Total, mem.Free
		}
		for l := range nvml.NVLINK_MAX_LINKS {
			if st, ret := d.GetNvLinkState(l); ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED {
				g.NVLinks++
			}
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	inv.Topology = make([][]string, n)
	for i := range n {
		inv.Topology[i] = make([]string, n)
		for j := range n {
			if i == j {
				inv.Topology[i][j] = "self"
				continue
			}
			lvl, ret := nvml.DeviceGetTopologyCommonAncestor(devs[i], devs[j])
			if ret != nvml.SUCCESS {
				inv.Topology[i][j] = "unknown"
				continue
			}
			inv.Topology[i][j] = topologyName(lvl)
		}
	}
	return inv, nil
}

func topologyName(l nvml.GpuTopologyLevel) string {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return "internal"
	case nvml.TOPOLOGY_SINGLE:
		return "single"
	case nvml.TOPOLOGY_MULTIPLE:
		return "multiple"
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return "hostbridge"
	case nvml.TOPOLOGY_NODE:
		return "node"
	case nvml.TOPOLOGY_SYSTEM:
		return "system"
	}
	return fmt.Sprintf("level%d", l)
}

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
