// Command questd is the questrt node daemon. It hosts the shards of the
// sequences placed on this node (package worker, served over gRPC by
// worker/remote), coordinates the sequences created through it (package
// coord: placement on grids of nodes, the client Decode API,
// forwarding of calls for sequences coordinated elsewhere), joins the
// cluster by memberlist gossip (package cluster) and serves the standard
// gRPC health service (NOT_SERVING until the node has joined and serves,
// and from the start of a drain). On --metrics-addr an HTTP server serves
// Prometheus metrics (/metrics: step phase times, steps by kind and code,
// pages read vs dense, steps failed by peer and kind, the node's
// sequences, grids, pages and members, memberlist's health score, build
// info, Go and process metrics), /healthz and /readyz. Both HTTP servers,
// that one and the completions API's, close connections that say nothing
// or stay idle and cap those open (--http-read-header-timeout,
// --http-idle-timeout, --http-max-conns: httpserver.go), so that a flood
// of idle connections cannot take the node's file descriptors; the gRPC
// server bounds its connections too (node). Run `questd --help`
// for the flags, the config file and the environment; `questd
// --version` prints the version line.
//
// Once serving, questd prints one JSON line on stdout ("metrics" only
// when the metrics server is on):
//
//	{"event":"ready","name":"node-0","grpc":"127.0.0.1:40123","gossip":"127.0.0.1:40124","metrics":"127.0.0.1:9464"}
//
// With --data-dir the grids hosted on this node persist their sequences
// there (--durability sync or periodic); after a restart, or a kill -9,
// the same coordinator's grid of the same shape recovers them when it
// opens again (the recovery is logged, lost tail tokens exactly, and
// counted in questrt_recovery_*). One questd per directory: a second one
// exits 2 before anything starts, naming it and the holder's pid (the
// lock is taken with the addresses, listen.go). A full disk (ENOSPC,
// EDQUOT) fails the calls that persist with RESOURCE_EXHAUSTED, "disk full" and no server path in the
// message (the change is in memory, not durable; the next one persists
// it once there is space); another I/O error fails them with INTERNAL.
// The node logs each failure with its file and counts it in
// questrt_persist_errors_total{kind} (persisterr.go). `questd
// --verify-data --data-dir DIR [--repair]` checks such a directory
// offline instead of serving (verify.go).
//
// Every address it listens on (--grpc-addr, --gossip-addr over TCP and
// UDP, --metrics-addr, --http-addr) is bound before anything starts and
// handed to its server (listen.go): one that cannot be bound stops
// questd with exit 2 and one line naming the flags and addresses.
//
// SIGTERM or SIGINT drains the in-flight calls and completions requests
// (up to --drain-timeout), leaves the cluster and exits 0 (a --data-dir
// node persists every sequence, tails included, first; when it cannot, a
// full disk, it logs which files failed and exits 1); a signal before
// the ready line, during the join or the model's load, stops it without
// one, exit 0. SIGHUP reloads the TLS certificate,
// key and CA (new connections, incoming and outgoing, use them; a file
// that does not load keeps the old ones). --token-file guards the client API with a bearer token;
// --print-config prints the effective configuration as YAML for
// --config. Logs go to stderr (log/slog; memberlist's
// and grpc's logs are bridged into it).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/questrt/questrt/internal/buildinfo"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

// run is questd with its arguments, environment and output: it returns
// the exit status (0 after a signal's drain, 2 for bad flags or config,
// TLS files that do not load and addresses that cannot be bound
// included, 1 for a failure to start or serve).
func run(ctx context.Context, args []string, getenv func(string) (string, bool), stdout, stderr io.Writer) int {
	if isVerify(args) {
		return runVerify(ctx, args, stdout, stderr)
	}
	cfg, err := loadConfig(args, getenv, stdout)
	if errors.Is(err, errHelp) || errors.Is(err, errPrinted) {
		return 0
	}
	if errors.Is(err, errVersion) {
		fmt.Fprintln(stdout, buildinfo.Read())
		return 0
	}
	if err == nil {
		err = checkTLSFiles(cfg)
	}
	if err == nil {
		err = checkServeFiles(cfg)
	}
	if err != nil {
		fmt.Fprintln(stderr, "questd:", err)
		return 2
	}
	// SIGHUP reloads the TLS files; caught here, it no longer ends the
	// process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := newLogger(cfg, stderr)
	// Every address first: one in use stops questd before anything
	// starts, as a bad flag does.
	ls, err := bindListeners(cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, "questd:", err)
		return 2
	}
	// The one registry of the process: no default (global) registry.
	reg := prometheus.NewRegistry()
	if err := serveOn(ctx, cfg, ls, log, stdout, reg, hup); err != nil {
		log.Error("questd failed", "err", err)
		if cfg.Log.Format == "json" {
			// The text log already reads as a line; a JSON one gets a
			// plain line for the human at the terminal too.
			fmt.Fprintln(stderr, "questd:", err)
		}
		return 1
	}
	return 0
}
