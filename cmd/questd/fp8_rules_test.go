package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestFP8Rules: --kv-cache-dtype fp8 is served in every layout (the
// worker wire names the page type to the cluster's nodes) and on
// either backend, the served grids' pages are fp8 (completion's KVDType),
// the GPU prefills fp8 pages (--serve-layout device), and offload
// (--device-budget-pages) takes fp8 pages on either backend (the GPU's
// slot pools hold fp8 records). The CUDA rules are checked on the
// config (a build without -tags cuda refuses --backend cuda before
// them).
func TestFP8Rules(t *testing.T) {
	base, err := load(t, nil, append(append([]string(nil), smallNode...), "--model", "m", "--http-addr", "127.0.0.1:0", "--kv-cache-dtype", "fp8", "--serve-capacity-pages", "256")...)
	if err != nil {
		t.Fatal(err)
	}
	for _, backend := range []string{"cpu", "cuda"} {
		for _, layout := range []string{"local", "cluster", "device"} {
			c := base
			c.Devices.Backend, c.Serve.Layout = backend, layout
			err := c.validateAcross()
			switch {
			case layout == "device" && backend == "cpu":
				if err == nil || !strings.HasPrefix(err.Error(), `--serve-layout "device": needs --backend cuda`) {
					t.Errorf("device layout on the CPU: %v", err)
				}
				continue
			case err != nil:
				t.Errorf("--backend %s --serve-layout %s: %v", backend, layout, err)
			}
			if dt := c.serveConfig(slog.New(slog.DiscardHandler)).KVDType; dt != plan.FP8 {
				t.Errorf("--backend %s --serve-layout %s serves %v pages", backend, layout, dt)
			}
			c.Offload.DeviceBudgetPages = 8
			if err := c.validateAcross(); err != nil {
				t.Errorf("--backend %s --serve-layout %s offloads fp8 pages: %v", backend, layout, err)
			}
		}
	}
	// A GPU node without --model hosts fp8 pools for the cluster.
	c := base
	c.Serve.Model, c.Serve.Addr, c.Devices.Backend = "", "", "cuda"
	if err := c.validateAcross(); err != nil {
		t.Errorf("--backend cuda without --model: %v", err)
	}
	if !devicePrefills(plan.FP8) || !devicePrefills(plan.BFloat16) || devicePrefills(plan.Float32) {
		t.Error("the GPU prefills fp8 and bf16 pages, not f32")
	}
	// bf16 (the default) keeps f32 pages off the GPU, as before.
	c = base
	c.Devices.KVCacheDType = plan.BFloat16
	if dt := c.serveConfig(slog.New(slog.DiscardHandler)).KVDType; dt != plan.Float32 {
		t.Errorf("bf16 serves %v pages", dt)
	}
}
