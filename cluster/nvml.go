//go:build nvml || cuda

package cluster

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// discover lists the node's GPUs through go-nvml.
func discover() (Inventory, error) {
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
