//go:build cuda

package main

import (
	"fmt"
	"log/slog"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/node"
)

// cudaBuild reports whether this questd has the CUDA backend.
const cudaBuild = true

// openDevices starts one CUDA backend (its own context) per GPU of
// --devices (default: every GPU the driver lists, which honours
// CUDA_VISIBLE_DEVICES) for --backend cuda, and none for cpu; closing
// them is the caller's, after the node stopped. (Without a driver or a
// GPU the process never gets here: gorgonia.org/cu's init exits.)
func openDevices(cfg Config, log *slog.Logger) ([]node.Device, func(), error) {
	if cfg.Devices.Backend != "cuda" {
		return nil, func() {}, nil
	}
	n, err := cu.NumDevices()
	if err != nil {
		return nil, nil, fmt.Errorf("questd: count GPUs: %w", err)
	}
	ords := cfg.Devices.Ordinals
	if len(ords) == 0 {
		for i := range n {
			ords = append(ords, i)
		}
	}
	var devs []node.Device
	closeAll := func() {
		for _, d := range devs {
			d.Backend.Close()
		}
	}
	for _, o := range ords {
		if o >= n {
			closeAll()
			return nil, nil, fmt.Errorf("questd: --devices: GPU %d, but the driver lists %d (ordinals 0..%d)", o, n, n-1)
		}
		dev, err := cu.GetDevice(o)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("questd: GPU %d: %w", o, err)
		}
		name, _ := dev.Name()
		mem, _ := dev.TotalMem()
		be, err := cuda.New(cuda.Config{Device: o, DType: cfg.Devices.KVCacheDType})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("questd: GPU %d: %w", o, err)
		}
		devs = append(devs, node.Device{Backend: be, Kind: "cuda", Name: fmt.Sprintf("GPU %d: %s", o, name), MemoryBytes: uint64(mem)})
		log.Info("device", "gpu", o, "name", name, "memory_bytes", mem, "kv_cache_dtype", cfg.Devices.KVCacheDType.String())
	}
	return devs, closeAll, nil
}
