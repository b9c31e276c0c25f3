package remote

import (
	"fmt"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/worker"
)

// The config codec of the worker API, for the other APIs that share its
// GridConfig message (api/decode/v1). The tensor codecs they share are
// package api/wire's.

// GridConfigProto is c as the GridConfig message (nil when c does not
// encode: a negative size).
func GridConfigProto(c worker.Config) *workerv1.GridConfig {
	g, err := encodeConfig(c)
	if err != nil {
		return nil
	}
	return g
}

// GridConfigFromProto is a GridConfig message as a worker.Config,
// validated.
func GridConfigFromProto(g *workerv1.GridConfig) (worker.Config, error) {
	c, err := decodeConfig(g)
	if err != nil {
		return worker.Config{}, err
	}
	if err := c.Validate(); err != nil {
		return worker.Config{}, fmt.Errorf("%w: %w", worker.ErrBadMessage, err)
	}
	return c, nil
}
