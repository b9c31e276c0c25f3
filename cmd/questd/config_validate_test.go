package main

import (
	"encoding/base64"
	"strings"
	"testing"
)

// TestValidateNamesFlag: every validation error starts with the flag it
// is about, in the form `--flag "value": why`.
func TestValidateNamesFlag(t *testing.T) {
	keyFile := func(n int) string {
		return writeFile(t, "gossip.key", base64.StdEncoding.EncodeToString(make([]byte, n))+"\n")
	}
	for _, tc := range []struct {
		args []string
		want string // prefix of the error
	}{
		{[]string{"--name", ""}, `--name "": `},
		{[]string{"--name", "a b"}, `--name "a b": `},
		{[]string{"--grpc-addr", "7070"}, `--grpc-addr "7070": want host:port`},
		{[]string{"--grpc-addr", "localhost:7070"}, `--grpc-addr "localhost:7070": host "localhost" is not an IP address`},
		{[]string{"--grpc-addr", "127.0.0.1:70000"}, `--grpc-addr "127.0.0.1:70000": port`},
		{[]string{"--grpc-addr", "0.0.0.0:7070"}, `--grpc-addr "0.0.0.0:7070": listens on every interface: set --advertise`},
		{[]string{"--grpc-addr", ":7070"}, `--grpc-addr ":7070": listens on every interface`},
		{[]string{"--advertise", "node-1"}, `--advertise "node-1": not an IP address`},
		{[]string{"--advertise", "::"}, `--advertise "::": unspecified`},
		{[]string{"--gossip-addr", "x:1"}, `--gossip-addr "x:1": host "x" is not an IP address`},
		{[]string{"--grpc-addr", "10.0.0.5:7070"}, `--gossip-addr "127.0.0.1:7946": binds 127.0.0.1 but the node advertises 10.0.0.5`},
		{[]string{"--advertise", "10.0.0.5"}, `--grpc-addr "127.0.0.1:7070": binds a loopback address, which other nodes cannot reach at --advertise 10.0.0.5`},
		{[]string{"--advertise", "10.0.0.5", "--grpc-addr", "0.0.0.0:7070"}, `--gossip-addr "127.0.0.1:7946": binds a loopback address`},
		{[]string{"--join", "10.0.0.6"}, `--join "10.0.0.6": want host:port`},
		{[]string{"--join", "10.0.0.6:0"}, `--join "10.0.0.6:0": port`},
		{[]string{"--cluster-label", strings.Repeat("l", 256)}, `--cluster-label "` + strings.Repeat("l", 256) + `": 256 bytes, limit 255`},
		{[]string{"--gossip-key-file", keyFile(20)}, `--gossip-key-file "`},
		{[]string{"--gossip-key-file", writeFile(t, "bad.key", "not base64!\n")}, `--gossip-key-file "`},
		{[]string{"--tls-cert", "c.pem"}, `--insecure "true": conflicts with --tls-cert "c.pem"`},
		{[]string{"--layers", "0"}, `--layers "0": must be at least 1`},
		{[]string{"--q-heads", "0"}, `--q-heads "0": must be at least 1`},
		{[]string{"--kv-heads", "-1"}, `--kv-heads "-1": must be at least 1`},
		{[]string{"--head-dim", "0"}, `--head-dim "0": `},
		{[]string{"--page-size", "0"}, `--page-size "0": `},
		{[]string{"--cp", "0"}, `--cp "0": `},
		{[]string{"--tp", "0"}, `--tp "0": `},
		{[]string{"--capacity-pages", "0"}, `--capacity-pages "0": `},
		{[]string{"--capacity-pages", "4294967296"}, `--capacity-pages "4294967296": more than`},
		{[]string{"--block-pages", "0"}, `--block-pages "0": `},
		{[]string{"--kv-heads", "6", "--q-heads", "30", "--tp", "4"}, `--kv-heads "6": not divisible by --tp 4`},
		{[]string{"--q-heads", "30"}, `--q-heads "30": not a multiple of --kv-heads 8`},
		{[]string{"--budget-tokens", "8"}, `--budget-tokens "8": below one page (--page-size 16)`},
		{[]string{"--sink-pages", "-1"}, `--sink-pages "-1": `},
		{[]string{"--local-pages", "-1"}, `--local-pages "-1": `},
		{[]string{"--sink-pages", "500"}, `--sink-pages "500": plus --local-pages 1 forced pages exceed K = 128 pages`},
		{[]string{"--budget-tokens", "32", "--local-pages", "3"}, `--sink-pages "0": plus --local-pages 3 forced pages exceed K = 2 pages`},
		{[]string{"--dense-layers", "-1"}, `--dense-layers "-1": `},
		{[]string{"--gqa", "wide"}, `--gqa "wide": `},
		{[]string{"--selector", "best"}, `--selector "best": `},
		{[]string{"--selection", "some"}, `--selection "some": `},
		{[]string{"--selection", "replicated", "--selector", "recent"}, `--selection "replicated": needs --selector quest or dense`},
		{[]string{"--max-pages", "-1"}, `--max-pages "-1": `},
		{[]string{"--max-pages", "100"}, `--max-pages "100": below --capacity-pages 1024`},
		{[]string{"--max-memory", "lots"}, `--max-memory "lots": not a size`},
		{[]string{"--backend", "gpu"}, `--backend "gpu": want cpu or cuda`},
		{[]string{"--devices", "0,1"}, `--devices "0,1": needs --backend cuda`},
		{[]string{"--backend", "cuda", "--devices", "0,x"}, `--devices "0,x": "x" is not a GPU ordinal`},
		{[]string{"--backend", "cuda", "--devices", "-1"}, `--devices "-1": "-1" is not a GPU ordinal`},
		{[]string{"--kv-cache-dtype", "fp4"}, `--kv-cache-dtype "fp4": `},
		{[]string{"--kv-cache-dtype", "f16"}, `--kv-cache-dtype "f16": needs --backend cuda`},
		{[]string{"--kv-cache-dtype", "fp8"}, `--kv-cache-dtype "fp8": needs --model (or --backend cuda)`},
		{[]string{"--device-budget-pages", "-1"}, `--device-budget-pages "-1": must not be negative`},
		{[]string{"--device-budget-pages", "1025"}, `--device-budget-pages "1025": above --capacity-pages 1024`},
		{[]string{"--device-budget-pages", "x"}, `--device-budget-pages "x": not an integer`},
		{[]string{"--eviction", "fifo"}, `--eviction "fifo": want lru or score`},
		{[]string{"--eviction="}, `--eviction "": want lru or score`},
		{[]string{"--device-budget-pages", "64", "--prefetch-pages", "-1"}, `--prefetch-pages "-1": must not be negative`},
		{[]string{"--device-budget-pages", "64", "--prefetch-pages", "2000"}, `--prefetch-pages "2000": above --capacity-pages 1024`},
		{[]string{"--prefetch-pages", "8"}, `--prefetch-pages "8": needs --device-budget-pages`},
		{[]string{"--prefetch-pages", "2000"}, `--prefetch-pages "2000": above --capacity-pages 1024`},
		{[]string{"--device-budget-pages", "64", "--prefetch-cross-layer"}, `--prefetch-cross-layer "true": needs --prefetch-pages`},
		{[]string{"--prefetch-cross-layer=maybe"}, `--prefetch-cross-layer "maybe": not true or false`},
		{[]string{"--step-timeout", "0s"}, `--step-timeout "0s": must be positive`},
		{[]string{"--step-timeout", "soon"}, `--step-timeout "soon": not a duration such as 2s`},
		{[]string{"--probe-interval", "-1s"}, `--probe-interval "-1s": must be positive`},
		{[]string{"--probe-timeout", "0s"}, `--probe-timeout "0s": `},
		{[]string{"--probe-timeout", "1s"}, `--probe-timeout "1s": must be below --probe-interval 1s`},
		{[]string{"--suspicion-mult", "0"}, `--suspicion-mult "0": `},
		{[]string{"--gossip-interval", "0s"}, `--gossip-interval "0s": `},
		{[]string{"--drain-timeout", "-1s"}, `--drain-timeout "-1s": must not be negative`},
		{[]string{"--metrics-addr", "9464"}, `--metrics-addr "9464": want host:port`},
		{[]string{"--metrics-addr", "localhost:9464"}, `--metrics-addr "localhost:9464": host "localhost" is not an IP address`},
		{[]string{"--metrics-addr", "127.0.0.1:99999"}, `--metrics-addr "127.0.0.1:99999": port`},
		{[]string{"--log-level", "trace"}, `--log-level "trace": want debug, info, warn or error`},
		{[]string{"--log-format", "xml"}, `--log-format "xml": want text or json`},
		{[]string{"--layers", "x"}, `--layers "x": not an integer`},
		{[]string{"--layers", "99999999999999999999"}, `--layers "99999999999999999999": too large for an integer`},
		{[]string{"--plaintext=maybe"}, `--plaintext "maybe": not true or false`},
		{[]string{"--no-such"}, `unknown flag --no-such`},
		{[]string{"stray"}, `unexpected arguments ["stray"]`},
	} {
		args := append([]string{"--plaintext"}, tc.args...)
		_, err := load(t, nil, args...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: err %v, want one line starting %q", tc.args, err, tc.want)
		}
	}

	// TLS is all or nothing without --plaintext.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, `--tls-cert "": mutual TLS needs`},
		{[]string{"--tls-cert", "c.pem"}, `--tls-key "": mutual TLS needs`},
		{[]string{"--tls-cert", "c.pem", "--tls-key", "k.pem"}, `--tls-ca "": mutual TLS needs`},
		{[]string{"--tls-key", "k.pem", "--tls-ca", "ca.pem"}, `--tls-cert "": `},
	} {
		_, err := load(t, nil, tc.args...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.args, err, tc.want)
		}
	}
	if c, err := load(t, nil, "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"); err != nil || c.Security.Plaintext {
		t.Errorf("all three TLS files: %v", err)
	}

	// A value from the environment or the file says where it came from.
	_, err := load(t, map[string]string{"QUESTRT_KV_HEADS": "6", "QUESTRT_TP": "4"}, "--plaintext", "--q-heads", "36")
	if err == nil || err.Error() != `--kv-heads "6": not divisible by --tp 4 (set by QUESTRT_KV_HEADS)` {
		t.Errorf("from env: %v", err)
	}
	p := writeFile(t, "q.yaml", "plaintext: true\n\nlayers: 0\n")
	_, err = load(t, nil, "--config", p)
	if err == nil || err.Error() != `--layers "0": must be at least 1 (set by `+p+` line 3)` {
		t.Errorf("from file: %v", err)
	}
}
