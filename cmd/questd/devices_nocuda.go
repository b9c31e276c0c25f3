//go:build !cuda

package main

import (
	"errors"
	"log/slog"

	"github.com/questrt/questrt/node"
)

// cudaBuild reports whether this questd has the CUDA backend.
const cudaBuild = false

// openDevices returns no device (the worker server's own CPU backend) for
// --backend cpu; this build has no CUDA backend.
func openDevices(cfg Config, _ *slog.Logger) ([]node.Device, func(), error) {
	if cfg.Devices.Backend == "cuda" { // Validate refuses it first
		return nil, nil, errors.New("--backend cuda needs a build with -tags cuda (see README: building for a GPU host)")
	}
	return nil, func() {}, nil
}
