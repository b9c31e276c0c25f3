package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/grpclog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/questrt/questrt/internal/buildinfo"
	"github.com/questrt/questrt/node"
)

// leaveTimeout bounds the leave after the drain.
const leaveTimeout = 2 * time.Second

// version is the questrt version questd advertises: the main module's
// (internal/buildinfo; "(devel)" for a build without one).
var version = buildinfo.Read().Version

// newLogger returns the slog logger of --log-level and --log-format on w,
// and bridges grpc's logs into it (grpclog is process-wide: main owns it).
func newLogger(cfg Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.Log.Level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.Log.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	log := slog.New(h)
	g := log.With("component", "grpc")
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, lineLogger{g, slog.LevelWarn}, lineLogger{g, slog.LevelError}))
	return log
}

// lineLogger writes each line it is given as one log record.
type lineLogger struct {
	log *slog.Logger
	lv  slog.Level
}

func (l lineLogger) Write(p []byte) (int, error) {
	l.log.Log(context.Background(), l.lv, strings.TrimSpace(string(p)))
	return len(p), nil
}

// warnInsecure logs, with --insecure, that gRPC runs without TLS.
func warnInsecure(cfg Config, log *slog.Logger) {
	if !cfg.Security.Plaintext {
		return
	}
	msg := "gRPC without TLS: anyone who reaches --grpc-addr can call the client and worker APIs, read and change every sequence's KV pages and join grids; use --tls-cert, --tls-key and --tls-ca outside a trusted network"
	if cfg.Security.Token != "" {
		msg += "; the bearer token of --token-file travels in the clear"
	}
	log.Warn(msg, "grpc", cfg.Node.GRPCAddr)
}

// reloadTLS reads the TLS files again (SIGHUP) and logs the outcome; nil
// rl (--insecure) has nothing to reload.
func reloadTLS(rl *certReloader, log *slog.Logger) {
	if rl == nil {
		log.Info("SIGHUP: no TLS certificates to reload (--insecure)")
		return
	}
	if err := rl.reload(); err != nil {
		log.Error("reload TLS certificates: keeping the old ones", "err", err)
		return
	}
	attrs := []any{"cert", rl.certFile, "ca", rl.caFile}
	if l := rl.leaf(); l != nil {
		attrs = append(attrs, "subject", l.Subject.String(), "not_after", l.NotAfter.UTC().Format(time.RFC3339))
	}
	log.Info("reloaded TLS certificates", attrs...)
}

// metricsShutdown bounds the end of the metrics server's requests in
// progress after the node stopped.
const metricsShutdown = 2 * time.Second

// serve runs the node until ctx ends (a signal), then drains and leaves.
// Its metrics go to reg; the HTTP server of --metrics-addr starts before
// the node (/healthz answers during the join, /readyz says 503 until the
// node serves) and stops after it.
//
// Every signal received on hup (SIGHUP) reloads the TLS files; hup may
// be nil.
func serve(ctx context.Context, cfg Config, log *slog.Logger, stdout io.Writer, reg *prometheus.Registry, hup <-chan os.Signal) error {
	ls, err := bindListeners(cfg, log)
	if err != nil {
		return err
	}
	return serveOn(ctx, cfg, ls, log, stdout, reg, hup)
}

// serveOn is serve on the listeners of bindListeners, which it takes
// over (every one is closed when it returns).
func serveOn(ctx context.Context, cfg Config, ls *listeners, log *slog.Logger, stdout io.Writer, reg *prometheus.Registry, hup <-chan os.Signal) error {
	defer ls.close() // those not handed over yet
	var (
		rl *certReloader
		tc *tls.Config
	)
	if !cfg.Security.Plaintext {
		var err error
		if rl, err = newCertReloader(cfg.Node.Name, cfg.Security.TLSCert, cfg.Security.TLSKey, cfg.Security.TLSCA); err != nil {
			return err
		}
		tc = rl.config()
	}
	wc := cfg // the warning names the address bound (port 0: the one picked)
	if ls.grpc != nil {
		wc.Node.GRPCAddr = ls.grpc.Addr().String()
	}
	warnInsecure(wc, log)
	var st readiness
	m, err := newMetrics(reg, &st)
	if err != nil {
		return err
	}
	pw := newPersistWatch(m, log.With("component", "persist"))
	warnOpenFiles(cfg, log)
	var ms *httpServer
	if ls.metrics != nil {
		if ms, err = startMetricsServer(take(&ls.metrics), httpHandler(reg, st.ready, log), cfg.httpServer(), reg, log.With("component", "metrics")); err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), metricsShutdown)
			defer cancel()
			ms.shutdown(sctx)
		}()
	}
	logDataDir(cfg.Storage.DataDir, cfg.Node.Name, log)
	devs, closeDevs, err := openDevices(cfg, log)
	if err != nil {
		return err
	}
	defer closeDevs() // after the node stopped (deferred below it)
	mc := cfg.memberConfig()
	mc.Listener = take(&ls.gossip)
	n, err := node.Start(ctx, node.Config{
		GRPCAddr: cfg.Node.GRPCAddr, Listener: take(&ls.grpc), Advertise: cfg.Node.Advertise, GRPCAdvertise: cfg.Node.GRPCAdvertise, Member: mc, Engine: cfg.engineConfig(),
		MaxPages: cfg.hostPages(), MemoryLimit: cfg.Capacity.MaxMemory, TLS: tc, Plaintext: cfg.Security.Plaintext, Token: cfg.Security.Token, RequireCertRoles: cfg.Security.RequireCertRoles,
		DrainTimeout: cfg.Node.DrainTimeout, GridIdle: cfg.Node.GridIdle, Version: version, Logger: log, Observe: m.observe,
		DataDir: cfg.Storage.DataDir, DataDirLock: take(&ls.dataLock), Durability: cfg.Storage.Durability, SyncInterval: cfg.Storage.SyncInterval,
		Verify: cfg.Storage.Verify, ScrubRate: cfg.Storage.ScrubRate, OnPersistError: pw.report,
		OnQuarantine: func(string, string, error) { m.quarantined.Inc() },
		Devices:      devs, DeviceResident: len(devs) > 0,
	})
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// A signal during the join (--join retrying a peer that is
			// not up yet): a stop asked for, not a failure.
			log.Info("stopped before the node joined the cluster", "why", context.Cause(ctx).Error(), "join", err)
			return nil
		}
		return err
	}
	var api *completions
	if cfg.Serve.Model != "" {
		if api, err = startCompletions(cfg, take(&ls.http), n, reg, log.With("component", "serve")); err != nil {
			lctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
			defer cancel()
			n.Stop(lctx)
			return err
		}
	}
	st.set(n)
	// A signal during the start (the model's load) stops the node
	// without a ready line: it never served.
	line := map[string]string{"event": "ready", "name": n.Name(), "grpc": n.Addr(), "gossip": n.GossipAddr()}
	if ms != nil {
		line["metrics"] = ms.addr
	}
	if api != nil {
		line["http"] = api.http.addr
	}
	ready, _ := json.Marshal(line)
	if ctx.Err() == nil {
		fmt.Fprintf(stdout, "%s\n", ready)
	}
	if cfg.Node.ReadyFile != "" && ctx.Err() == nil {
		if err := os.WriteFile(cfg.Node.ReadyFile, append(ready, '\n'), 0o644); err != nil {
			log.Warn("ready file", "path", cfg.Node.ReadyFile, "err", err)
		}
	}
	var serveErr error
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case serveErr = <-n.Served():
			break wait
		case <-hup:
			reloadTLS(rl, log)
			if api != nil && api.cert != nil {
				if err := api.cert.reload(); err != nil {
					log.Error("reload the completions API's certificate; the old one stays", "err", err)
				} else {
					log.Info("reloaded the completions API's certificate", "cert", cfg.Serve.TLSCert)
				}
			}
		}
	}
	if ctx.Err() != nil {
		// Said at once: the drain may take --drain-timeout.
		attrs := []any{"why", context.Cause(ctx).Error(), "drain_timeout", cfg.Node.DrainTimeout}
		if api != nil {
			as := api.srv.Stats()
			attrs = append(attrs, "requests_running", as.Running, "requests_queued", as.Queued)
		}
		log.Info("stopping: draining, then leaving the cluster", attrs...)
	}
	st.drain()
	pw.beginStop()
	if api != nil {
		actx, cancel := context.WithTimeout(context.Background(), max(cfg.Node.DrainTimeout, time.Second))
		api.stop(actx, log)
		cancel()
	}
	// The leave is bounded apart from the drain: when every node stops at
	// once nobody acknowledges it.
	lctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	stopErr := n.Stop(lctx)
	if serveErr != nil {
		return fmt.Errorf("serve: %w", serveErr)
	}
	return errors.Join(stopErr, pw.stopError())
}
