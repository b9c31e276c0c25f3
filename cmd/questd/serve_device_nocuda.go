//go:build !cuda

package main

import (
	"errors"
	"log/slog"

	"github.com/questrt/questrt/completion"
)

// loadDeviceServer needs the CUDA backend (Validate refuses
// --serve-layout device without --backend cuda, which this build refuses).
func loadDeviceServer(Config, completion.Config, *slog.Logger) (*completion.Server, func(), error) {
	return nil, nil, errors.New("--serve-layout device needs a build with -tags cuda (see README: building for a GPU host)")
}
