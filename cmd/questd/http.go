package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/questrt/questrt/chat"
	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/internal/serveengine"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/plan"
)

// completions is the OpenAI-compatible completions API of --model and
// --http-addr: the completion.Server and its HTTP server (POST
// /v1/completions and /v1/chat/completions, GET /v1/models, GET /health,
// GET /metrics (the node's, as on --metrics-addr), and the last --request-history
// requests under /admin/requests for questctl replay-request). With
// --monitor-rate its quality monitor's histograms go to the process's
// registry (monitor.go). With --serve-layout cluster the requests' KV
// pages live on --serve-cp x --serve-tp grids of the cluster's nodes,
// which this node's coordinator drives; the model runs here.
type completions struct {
	srv  *completion.Server
	http *httpServer
	// cert is the HTTPS certificate (--http-tls-cert), reloaded on
	// SIGHUP; nil for plaintext.
	cert *httpCert
	// closeDevice frees the device executor and its GPU backend after
	// srv closed (--serve-layout device; nil otherwise).
	closeDevice func()
	// stopStats ends the stats line's goroutine (--log-stats-interval;
	// nil when off).
	stopStats func()
}

// serveConfig is the serve package configuration of cfg: the node's selection
// policy (per-layer budgets of --policy included), the served engine's
// grid and pool and the request caps (startCompletions adds where the
// pages live: the node's coordinator with --serve-layout cluster).
func (c Config) serveConfig(log *slog.Logger) completion.Config {
	sc := completion.DefaultConfig()
	sc.Engines = serveengine.Engines()
	if c.Devices.KVCacheDType == plan.FP8 {
		// The served grids' pages: the in-process engine's CPU pages
		// (--serve-layout local, either backend), the cluster's grids'
		// (cluster: the grid config names the type to its nodes) or the
		// GPU's (device: loadDeviceServer sets it too).
		sc.KVDType = plan.FP8
	}
	sc.ModelName = c.Serve.ModelName
	sc.Policy = c.engineConfig().Policy
	sc.CP, sc.TP = c.Serve.CP, c.Serve.TP
	sc.PolicyGrids = c.Serve.PolicyGrids
	sc.GridRetries, sc.GridRetryWait = c.Serve.GridRetries, c.Serve.GridRetryWait
	sc.ClusterWait, sc.ClusterResize = c.Serve.ClusterWait, c.Serve.ClusterResize
	sc.CapacityPages, sc.MemoryFraction = c.servePages(), c.Serve.MemoryFraction
	sc.DeviceMemoryFraction = c.Serve.GPUMemoryUtilization
	sc.GrowReservations = c.Serve.GrowReservations
	sc.PrefixCaching, sc.PrefixCachePages = c.Serve.PrefixCaching, c.Serve.PrefixCachePages
	sc.MemoryLimit = c.Capacity.MaxMemory
	sc.MaxRunning, sc.MaxQueued, sc.ChunkTokens = c.Serve.MaxRunning, c.Serve.MaxQueued, c.Serve.PrefillChunk
	sc.MaxBatchedTokens, sc.MaxITLFactor = c.Serve.MaxBatchedTokens, c.Serve.MaxITLFactor
	sc.MaxContext, sc.MaxBodyBytes, sc.RequestTimeout = c.Serve.MaxModelLen, int64(c.Serve.MaxRequestBytes), c.Serve.RequestTimeout
	sc.SSEKeepAlive = c.Serve.SSEKeepAlive
	sc.DefaultMaxTokens = c.Serve.DefaultMaxTokens
	sc.Monitor.Rate, sc.Monitor.Queue = c.Serve.MonitorRate, c.Serve.MonitorQueue
	sc.History = c.Serve.RequestHistory
	sc.Logger = log
	return sc
}

// startCompletions loads --model and serves it on lis, the listener of
// --http-addr, which it takes over (closed when it fails), its
// requests' sequences on n's cluster with --serve-layout cluster; with
// --monitor-rate the quality monitor's metrics go to reg.
func startCompletions(cfg Config, lis net.Listener, n *node.Node, reg *prometheus.Registry, log *slog.Logger) (_ *completions, err error) {
	defer func() {
		if err != nil {
			lis.Close()
		}
	}()
	sc := cfg.serveConfig(log)
	sc.Cluster = cfg.serveCluster(n)
	name := sc.ModelName
	if name == "" {
		name = filepath.Base(filepath.Clean(cfg.Serve.Model))
	}
	lat, err := newServeLatency(reg, name, log)
	if err != nil {
		return nil, fmt.Errorf("serve metrics: %w", err)
	}
	sc.Observe = lat.observe
	if sc.Monitor.Rate > 0 {
		mm, err := newMonitorMetrics(reg)
		if err != nil {
			return nil, err
		}
		sc.Monitor.Observe = mm.observe
	}
	if err := loadChatTemplate(cfg, &sc, log); err != nil {
		return nil, err
	}
	if cfg.Serve.Layout == "device" {
		// completion.Load reads generation_config.json for the other
		// layouts.
		if sc.Sampling, err = completion.LoadSampling(cfg.Serve.Model); err != nil {
			return nil, fmt.Errorf("--model %q: %w", cfg.Serve.Model, err)
		}
	}
	var srv *completion.Server
	var closeDevice func()
	if cfg.Serve.Layout == "device" {
		srv, closeDevice, err = loadDeviceServer(cfg, sc, log)
	} else {
		srv, err = completion.Load(cfg.Serve.Model, sc)
	}
	if err != nil {
		return nil, fmt.Errorf("--model %q (--serve-layout %s, --serve-cp %d, --serve-tp %d): %w", cfg.Serve.Model, cfg.Serve.Layout, cfg.Serve.CP, cfg.Serve.TP, err)
	}
	closeAll := func() {
		srv.Close()
		if closeDevice != nil {
			closeDevice()
		}
	}
	if err := reg.Register(newServeCounts(srv)); err != nil {
		closeAll()
		return nil, fmt.Errorf("serve metrics: %w", err)
	}
	if sc.Monitor.Rate > 0 {
		if err := reg.Register(newMonitorCounts(srv)); err != nil {
			closeAll()
			return nil, fmt.Errorf("monitor metrics: %w", err)
		}
	}
	hc := cfg.httpServer()
	var cert *httpCert
	if cfg.Serve.TLSCert != "" {
		if cert, err = newHTTPCert(cfg.Serve.TLSCert, cfg.Serve.TLSKey); err != nil {
			closeAll()
			return nil, err
		}
		hc.TLS = cert.tlsConfig()
	}
	handler := allowOrigins(cfg.Serve.AllowedOrigins, adminLoopback(cfg.Security.Token, apiHandler(srv, cfg.Security.Token, reg, log)))
	h, err := serveHTTP("completions", "http-addr", lis, handler, hc, reg, log)
	if err != nil {
		closeAll()
		return nil, err
	}
	warnExposure(h.addr, cert != nil, cfg.Security.Token != "", log)
	// As vLLM states its KV cache at start: the context bound and how
	// many requests of that length the pool holds at once.
	st := srv.Stats()
	attrs := []any{"addr", h.addr, "tls", cert != nil, "model", srv.Name(), "layout", cfg.Serve.Layout, "cp", cfg.Serve.CP, "tp", cfg.Serve.TP,
		"max_model_len", srv.MaxModelLen(), "pool_pages", st.CapacityPages, "pool_tokens_per_shard", st.CapacityPages * cfg.Grid.PageSize}
	if ps := srv.PoolSize(); ps.Device {
		attrs = append(attrs, "pool_sized_from", "gpu memory", "pool_bytes", memlimit.Bytes(ps.Bytes()), "gpu_free", memlimit.Bytes(ps.Available),
			"gpu_total", memlimit.Bytes(ps.Total), "gpu_memory_utilization", ps.Fraction, "page_bytes", ps.PageBytes, "pool_bound", ps.Bound)
	} else if ps.FromMemory {
		attrs = append(attrs, "pool_sized_from", "memory", "pool_bytes", memlimit.Bytes(ps.Bytes()), "memory_available", memlimit.Bytes(ps.Available),
			"serve_memory_fraction", ps.Fraction, "pool_bound", ps.Bound)
	} else if ps.Cluster {
		// Each of the ranks (the served grid's and those of
		// --serve-policy-grids more) reserves the pool on a node.
		attrs = append(attrs, "pool_sized_from", "the nodes' free pages", "nodes", ps.Nodes, "nodes_free_pages", ps.NodePages,
			"ranks", ps.Ranks, "serve_policy_grids", cfg.Serve.PolicyGrids, "pool_bound", ps.Bound)
	} else {
		attrs = append(attrs, "pool_sized_from", "--serve-capacity-pages")
	}
	log.Info("completions API", attrs...)
	c := &completions{srv: srv, http: h, cert: cert, closeDevice: closeDevice}
	if cfg.Serve.LogStatsInterval > 0 {
		c.stopStats = logServeStats(srv, cfg.Serve.LogStatsInterval, log)
	}
	return c, nil
}

// loadChatTemplate sets sc's chat template: --chat-template's (an error
// stops the start), else the checkpoint's for --serve-layout device
// (completion.Load reads it for the other layouts); a checkpoint without
// a usable one serves completions, and chat requests get 400 saying why.
func loadChatTemplate(cfg Config, sc *completion.Config, log *slog.Logger) error {
	if cfg.Serve.ChatTemplate != "" {
		t, err := chat.LoadFile(cfg.Serve.ChatTemplate, cfg.Serve.Model)
		if err != nil {
			return fmt.Errorf("--chat-template %q: %w", cfg.Serve.ChatTemplate, err)
		}
		sc.ChatTemplate = t
	} else if cfg.Serve.Layout == "device" {
		t, err := chat.Load(cfg.Serve.Model)
		switch {
		case err == nil:
			sc.ChatTemplate = t
		case !errors.Is(err, chat.ErrNoTemplate):
			log.Warn("the checkpoint's chat template cannot be used: chat requests get 400", "err", err)
		}
	}
	if sc.ChatTemplate != nil {
		log.Info("chat template", "source", sc.ChatTemplate.Source())
	}
	return nil
}

// stop drains the API (new requests get 503, admitted ones finish within
// ctx), then closes the model, which fails the requests still running
// (503; a stream gets an error event and its end) while their
// connections are still open, so that their clients learn why, and then
// the HTTP server (up to stopFlush for those answers to go out).
func (c *completions) stop(ctx context.Context, log *slog.Logger) {
	if c.stopStats != nil {
		defer c.stopStats() // the drain's last seconds logged too
	}
	if err := c.srv.Drain(ctx); err != nil {
		log.Warn("completions drain: --drain-timeout passed; the requests left fail with 503 server_shutting_down", "err", err)
	}
	if err := c.srv.Close(); err != nil {
		log.Warn("completions close", "err", err)
	}
	if c.closeDevice != nil {
		c.closeDevice()
	}
	fctx, cancel := context.WithTimeout(context.Background(), stopFlush)
	defer cancel()
	c.http.shutdown(fctx)
}

// stopFlush bounds how long the completions API's HTTP server waits, at
// a stop, for the answers of the requests the drain did not finish.
const stopFlush = 2 * time.Second
