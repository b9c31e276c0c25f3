package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/internal/faultproxy"
	"github.com/questrt/questrt/plan"
)

// TestGRPCAdvertiseFlag: --grpc-advertise defaults to "" (the advertise
// host and the --grpc-addr port), is set by the flag, QUESTRT_GRPC_ADVERTISE
// or the file, wants an IP host:port with a host and a port other nodes
// can dial, and is printed by --print-config.
func TestGRPCAdvertiseFlag(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, nil, ""},
		{nil, []string{"--grpc-advertise", "10.0.0.9:17070"}, "10.0.0.9:17070"},
		{nil, []string{"--grpc-advertise", "[2001:db8::1]:7070"}, "[2001:db8::1]:7070"},
		{map[string]string{"QUESTRT_GRPC_ADVERTISE": "10.0.0.8:1"}, nil, "10.0.0.8:1"},
		{map[string]string{"QUESTRT_GRPC_ADVERTISE": "10.0.0.8:1"}, []string{"--grpc-advertise", "10.0.0.7:2"}, "10.0.0.7:2"},
		{nil, []string{"--config", writeFile(t, "a.yaml", "grpc-advertise: 10.0.0.6:3\n")}, "10.0.0.6:3"},
	} {
		c, err := load(t, tc.env, append([]string{"--plaintext"}, tc.args...)...)
		if err != nil || c.Node.GRPCAdvertise != tc.want {
			t.Errorf("env %v, args %q: grpc-advertise %q, %v; want %q", tc.env, tc.args, c.Node.GRPCAdvertise, err, tc.want)
		}
		if err == nil && c.advertiseHost() != "127.0.0.1" {
			t.Errorf("args %q: --grpc-advertise changed the advertise host to %q", tc.args, c.advertiseHost())
		}
	}
	for _, tc := range []struct{ value, want string }{
		{"10.0.0.9", `--grpc-advertise "10.0.0.9": want host:port`},
		{"proxy:7070", `--grpc-advertise "proxy:7070": host "proxy" is not an IP address`},
		{"0.0.0.0:7070", `--grpc-advertise "0.0.0.0:7070": unspecified host`},
		{":7070", `--grpc-advertise ":7070": unspecified host`},
		{"[::]:7070", `--grpc-advertise "[::]:7070": unspecified host`},
		{"10.0.0.9:0", `--grpc-advertise "10.0.0.9:0": port 0`},
		{"10.0.0.9:70000", `--grpc-advertise "10.0.0.9:70000": port`},
	} {
		_, err := load(t, nil, "--plaintext", "--grpc-advertise", tc.value)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("--grpc-advertise %q: %v, want %s...", tc.value, err, tc.want)
		}
	}
	var out bytes.Buffer
	if _, err := loadConfig([]string{"--plaintext", "--grpc-advertise", "10.0.0.9:17070", "--print-config"}, envOf(nil), &out); err != errPrinted {
		t.Fatalf("--print-config: %v", err)
	}
	if !strings.Contains(out.String(), "\ngrpc-advertise: 10.0.0.9:17070\n") {
		t.Errorf("--print-config lacks grpc-advertise:\n%s", out.String())
	}
}

// TestServeGRPCAdvertise: with --grpc-advertise naming a proxy in front
// of --grpc-addr, the node's meta (Status' members), the ready line and
// the node's own calls to its worker API use the proxy's address; the
// listen address still serves.
func TestServeGRPCAdvertise(t *testing.T) {
	// A free port for the node, so that the proxy can target it first.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := l.Addr().String()
	l.Close()
	px, err := faultproxy.Listen(t.Context(), "127.0.0.1:0", faultproxy.Config{Target: listen})
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	adv := px.Addr().String()

	args := slices.Clone(smallNode)
	i := slices.Index(args, "--grpc-addr")
	args[i+1] = listen
	args = append(args, "--grpc-advertise", adv, "--metrics-addr", "")
	cfg, err := load(t, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	ready, ctx, stop := runServe(t, cfg)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	if ready["grpc"] != adv {
		t.Errorf("ready line grpc %q, want the advertised %q", ready["grpc"], adv)
	}

	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	c, err := client.Dial(dctx, listen, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status(dctx)
	if err != nil {
		t.Fatal(err)
	}
	if m := st.GetMembers(); len(m) != 1 || m[0].GetGrpcAddr() != adv {
		t.Fatalf("members %v: want m0 at %s", m, adv)
	}
	if n := px.Stats().Accepted; n != 0 {
		t.Fatalf("%d connections through the proxy before any sequence", n)
	}
	// The coordinator reaches its own rank at the advertised address.
	g := c.Geometry()
	rng := rand.New(rand.NewPCG(5, 6))
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	id, on, err := c.Create(dctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(on, []string{"m0"}) {
		t.Errorf("placed on %v", on)
	}
	kv := g.KVHeads * g.HeadDim
	for l := range g.Layers {
		if err := c.Append(dctx, id, l, vec(8*kv), vec(8*kv)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Step(dctx, 1, []client.Item{{Seq: id, Q: vec(g.QHeads * g.HeadDim)}}, client.StepOptions{}); err != nil {
		t.Fatal(err)
	}
	if ps := px.Stats(); ps.Accepted == 0 || ps.Bytes == 0 {
		t.Errorf("proxy stats %+v: the node's worker calls did not go through its advertised address", ps)
	}
}
