//go:build cuda

package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/model/gpu"
)

// loadDeviceServer loads --model for --serve-layout device: a CUDA
// backend of its own on the first GPU of --devices holds the served
// engine's pages (device-resident) and runs the model's decode steps
// through the device executor (model/gpu.Decoder); the weights, the
// activations of --max-running rows and the pages of
// --serve-capacity-pages are admitted against the GPU's free memory
// before anything is allocated there. With --serve-capacity-pages 0
// the weights and activations are admitted and allocated first, and
// completion.New sizes the pool from the GPU's memory left then
// (--gpu-memory-utilization); when not even one request of
// --max-model-len fits, the start stops with that error and everything
// allocated is freed. The returned func frees the executor and the
// backend (after the server closed).
func loadDeviceServer(cfg Config, sc completion.Config, log *slog.Logger) (*completion.Server, func(), error) {
	ctx := context.Background()
	ord := 0
	if len(cfg.Devices.Ordinals) > 0 {
		ord = cfg.Devices.Ordinals[0]
	}
	m, err := model.Load(cfg.Serve.Model, model.LoadOptions{MemoryLimit: sc.MemoryLimit})
	if err != nil {
		return nil, nil, err
	}
	tok, err := model.LoadTokenizer(cfg.Serve.Model, m.Config)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	if sc.ModelName == "" {
		sc.ModelName = filepath.Base(filepath.Clean(cfg.Serve.Model))
	}
	be, err := cuda.New(cuda.Config{Device: ord, DType: cfg.Devices.KVCacheDType})
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("GPU %d: %w", ord, err)
	}
	opt := gpu.Options{MaxBatch: min(sc.MaxRunning, 16), PrefillChunk: min(sc.ChunkTokens, gpu.DefaultPrefillChunk)}
	if sc.CapacityPages > 0 {
		// A pool sized from memory (0) is sized by completion.New
		// once the executor is allocated; gpu.New admits the rest.
		ec := engine.ModelConfig(m.Geometry(), sc.Policy, sc.CapacityPages)
		ec.Geometry.DType = cfg.Devices.KVCacheDType
		pb, err := ec.DevicePageBytes()
		if err == nil {
			err = gpu.AdmitAll(ctx, be, m.Config, opt, ec.CapacityPages, pb)
		}
		if err != nil {
			be.Close()
			m.Close()
			return nil, nil, err
		}
	}
	x, err := gpu.New(ctx, be, m, opt)
	if err != nil {
		be.Close()
		m.Close()
		return nil, nil, err
	}
	dec := &gpu.Decoder{X: x}
	sc.Backend, sc.DeviceResident, sc.KVDType, sc.Decoder = be, true, cfg.Devices.KVCacheDType, dec
	prefill := "cpu"
	switch {
	case !cfg.Serve.DevicePrefill:
	case !devicePrefills(cfg.Devices.KVCacheDType):
		log.Warn("prompts are prefilled on the CPU: the GPU's prefill attention reads bf16, f16 or fp8 pages", "kv_cache_dtype", cfg.Devices.KVCacheDType.String())
	default:
		sc.Prefiller, prefill = dec, "gpu"
		if g, err := be.GemmEngine(ctx); err != nil {
			log.Warn("prefill projections on questrt's own GEMM", "gemm", g, "why", err)
		} else {
			log.Info("prefill projections", "gemm", g)
		}
	}
	srv, err := completion.New(m, tok, sc)
	if err != nil {
		x.Close(ctx)
		be.Close()
		m.Close()
		return nil, nil, err
	}
	log.Info("serving on the GPU", "gpu", ord, "weights_GB", float64(x.WeightBytes())/1e9, "max_batch", opt.MaxBatch, "prefill", prefill)
	return srv, func() {
		x.Close(ctx)
		be.Close()
		m.Close()
	}, nil
}
