package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/questrt/questrt/worker/remote"
)

// TestAddrInUse: each address questd listens on (--grpc-addr,
// --gossip-addr over TCP and over UDP, --metrics-addr, --http-addr),
// taken by another socket, stops questd before anything starts: exit 2,
// one line on stderr naming the flag and the address, nothing on
// stdout, the data directory untouched (no lock held: it is not even
// created) and no goroutine left.
func TestAddrInUse(t *testing.T) {
	model := t.TempDir()
	if err := os.WriteFile(filepath.Join(model, "config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	// takeTCP and takeUDP hold a port of 127.0.0.1 for the test.
	takeTCP := func(t *testing.T) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l.Addr().String()
	}
	takeUDP := func(t *testing.T) string {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.LocalAddr().String()
	}
	for _, c := range []struct {
		flag  string
		take  func(*testing.T) string
		proto string // gossip's: which of its sockets failed
	}{
		{"grpc-addr", takeTCP, ""},
		{"gossip-addr", takeTCP, "tcp: "},
		{"gossip-addr", takeUDP, "udp: "}, // the TCP port free, the UDP one taken
		{"metrics-addr", takeTCP, ""},
		{"http-addr", takeTCP, ""},
	} {
		t.Run(c.flag, func(t *testing.T) {
			addr := c.take(t)
			dir := filepath.Join(t.TempDir(), "data")
			args := append(append([]string(nil), smallNode...), "--data-dir", dir, "--model", model, "--http-addr", "127.0.0.1:0", "--"+c.flag, addr)
			var out, errOut bytes.Buffer
			code := run(context.Background(), args, envOf(nil), &out, &errOut)
			want := "questd: --" + c.flag + " " + addr + ": " + c.proto + "address already in use" + inUseHint + "\n"
			if code != 2 || errOut.String() != want || out.Len() != 0 {
				t.Errorf("questd with --%s %s taken: exit %d, stderr %q, stdout %q; want exit 2, stderr %q", c.flag, addr, code, errOut.String(), out.String(), want)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("--data-dir %s: %v; want it untouched (not created)", dir, err)
			}
			goleak.VerifyNone(t, goleak.IgnoreCurrent())
		})
	}
}

// inUseHint ends the line of an address in use.
const inUseHint = " (another questd on this host? give each node its own ports, or port 0)"

// TestAddrsInUse: with every address taken (another questd's), the one
// line names them all, so that a second node on a host is fixed in one
// go.
func TestAddrsInUse(t *testing.T) {
	cfg, err := load(t, nil, smallNode...)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	first, err := bindListeners(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer first.close()
	grpc, gossip, metrics := first.grpc.Addr().String(), "127.0.0.1:"+strconv.Itoa(first.gossip.Port()), first.metrics.Addr().String()
	args := append(append([]string(nil), smallNode...), "--grpc-addr", grpc, "--gossip-addr", gossip, "--metrics-addr", metrics)
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, envOf(nil), &out, &errOut)
	want := "questd: --grpc-addr " + grpc + ": address already in use; --gossip-addr " + gossip + ": tcp: address already in use; --metrics-addr " + metrics + ": address already in use" + inUseHint + "\n"
	if code != 2 || errOut.String() != want || out.Len() != 0 {
		t.Errorf("questd on another's addresses: exit %d, stderr %q, stdout %q; want exit 2, stderr %q", code, errOut.String(), out.String(), want)
	}
}

// TestListenersHandedOn: bindListeners binds every address once (free
// ports for port 0, the gossip port free over both TCP and UDP) and the
// node serves on those very sockets (its ready line and --insecure's
// warning name their ports), closing them all at its stop.
func TestListenersHandedOn(t *testing.T) {
	cfg, err := load(t, nil, smallNode...)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	ls, err := bindListeners(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if ls.http != nil {
		t.Errorf("a listener for --http-addr without --model")
	}
	bound := cfg
	bound.Node.GRPCAddr, bound.Node.MetricsAddr = ls.grpc.Addr().String(), ls.metrics.Addr().String()
	bound.Membership.GossipAddr = "127.0.0.1:" + strconv.Itoa(ls.gossip.Port())
	// While held, a second bind of them fails, naming the first flag.
	if _, err := bindListeners(bound, log); err == nil || !strings.HasPrefix(err.Error(), "--grpc-addr "+bound.Node.GRPCAddr+": ") {
		t.Errorf("a second bind: %v", err)
	}
	var logs lockedBuffer
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := serveOn(ctx, cfg, ls, slog.New(slog.NewJSONHandler(&logs, nil)), pw, prometheus.NewRegistry(), nil)
		pw.Close()
		done <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	cancel()
	go io.Copy(io.Discard, pr)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("ready line: %v", err)
	}
	for _, w := range []string{`"grpc":"` + bound.Node.GRPCAddr + `"`, `"gossip":"` + bound.Membership.GossipAddr + `"`, `"metrics":"` + bound.Node.MetricsAddr + `"`} {
		if !strings.Contains(line, w) {
			t.Errorf("ready line %q does not say %s", line, w)
		}
	}
	// --insecure's warning names the address bound, not port 0.
	if !strings.Contains(logs.String(), `"msg":"gRPC without TLS`) || !strings.Contains(logs.String(), `"grpc":"`+bound.Node.GRPCAddr+`"`) {
		t.Errorf("the plaintext warning does not name %s:\n%s", bound.Node.GRPCAddr, logs.String())
	}
	// Everything closed at the stop: the addresses are free again.
	again, err := bindListeners(bound, log)
	if err != nil {
		t.Fatalf("the addresses after the stop: %v", err)
	}
	again.close()
}

// TestDataDirInUse: a --data-dir another process holds stops questd
// before anything starts, exit 2, one line naming the flag, the
// directory and the holder, its addresses freed; once questd ran on a
// directory and stopped, the directory is free again.
func TestDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	held, err := remote.LockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	args := append(append([]string(nil), smallNode...), "--data-dir", dir)
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, envOf(nil), &out, &errOut)
	want := "questd: --data-dir " + dir + ": data directory in use by another process (pid " + strconv.Itoa(os.Getpid()) + " holds " + filepath.Join(dir, "LOCK") + ")\n"
	if code != 2 || errOut.String() != want || out.Len() != 0 {
		t.Errorf("questd on a held --data-dir: exit %d, stderr %q, stdout %q; want exit 2, stderr %q", code, errOut.String(), out.String(), want)
	}
	goleak.VerifyNone(t, goleak.IgnoreCurrent())
	held.Close()

	cfg, err := load(t, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	_, _, stop := runServe(t, cfg)
	if _, err := remote.LockDataDir(dir); !errors.Is(err, remote.ErrDataDirInUse) {
		t.Errorf("the data dir while questd serves: %v, want it held", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	again, err := remote.LockDataDir(dir)
	if err != nil {
		t.Fatalf("the data dir after questd stopped: %v", err)
	}
	again.Close()
}
