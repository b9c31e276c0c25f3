package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

const usageHead = `Usage: questd [flags]

questd is the questrt node daemon. It joins the cluster by memberlist
gossip (--join), hosts the shards of the sequences placed on this node,
and serves the client and worker gRPC APIs and the gRPC health service on
--grpc-addr, and Prometheus metrics (/metrics), liveness (/healthz) and
readiness (/readyz: 200 once joined and serving, 503 while draining) over
HTTP on --metrics-addr; with --model, the completions API on --http-addr.
Every one of these addresses is bound before anything starts: one that
cannot be (in use, not an address of this host) stops questd with exit
status 2 and one line naming the flags. Once serving it prints one line
on stdout (and to --ready-file when set; "metrics" only with a
--metrics-addr, "http" only with --model):

  {"event":"ready","name":"NAME","grpc":"HOST:PORT","gossip":"HOST:PORT","metrics":"HOST:PORT"}

SIGTERM or SIGINT drains: in-flight steps and completions requests get
--drain-timeout to finish (new requests get 503; those still running
then fail with server_shutting_down, 503 or a stream's error event), then
the node leaves the cluster and exits 0; a signal before the ready line
stops it too, exit 0, with no ready line. SIGHUP reads --tls-cert,
--tls-key and --tls-ca again: new connections, incoming and outgoing,
use the new certificate and CAs, open ones go on; a file that does not
load keeps the old ones (logged).
questd --version prints the version line and exits 0; questd
--print-config prints the effective configuration as YAML in the format
--config reads (no secrets: the token file's name, not its token) and
exits 0. questd --verify-data --data-dir DIR [--repair] checks a data
directory offline instead of serving: one line per grid, exit 0 when all
is well, 1 on damage, 2 when it could not check (questd --verify-data
--help says more).

With --token-file every call of the client API (questrt.decode.v1.Decode),
of the worker API and of the collective streams (between nodes) must carry
the metadata "authorization: Bearer <token>"; nodes send it on their own
calls, so every node of a cluster needs the same token file. The health
service does not. Under mutual TLS each call is also authorized by the
role in the caller's certificate (a URI SAN, as questctl up issues): the
worker API and the collective streams need questrt://node/NAME, the client
API questrt://client/NAME or questrt://node/NAME (PERMISSION_DENIED
otherwise). A certificate without a role counts as a node's, with a
warning, unless --require-cert-roles.

Every flag can also be set in the environment, as QUESTRT_ and the flag's
name in upper case with '-' as '_' (QUESTRT_GRPC_ADDR; empty variables are
ignored), or in the YAML file of --config (or QUESTRT_CONFIG), whose keys
are the flag names (grpc-addr: 127.0.0.1:7070; lists as YAML sequences).
Precedence: flags, then the environment, then the file, then the defaults.
Another name of a flag (--plaintext for --insecure; vLLM's
--tensor-parallel-size for --tp and --decode-context-parallel-size for
--cp) sets the same value, with its own variable and key at the same
precedence; --print-config prints the flag's own name.
`

// printUsage writes the usage text: what questd does, the precedence
// rule and every flag with its default, by section.
func printUsage(w io.Writer, fs *flag.FlagSet, groups []flagGroup) {
	var b strings.Builder
	b.WriteString(usageHead)
	for _, g := range groups {
		fmt.Fprintf(&b, "\n%s:\n", g.title)
		for _, name := range g.names {
			f := fs.Lookup(name)
			// The usage's `name` is the placeholder (flag's rule); a
			// text or list flag without one shows "value".
			arg, usage := flag.UnquoteUsage(f)
			if _, ok := f.Value.(interface{ IsBoolFlag() bool }); ok {
				arg = ""
			}
			fmt.Fprintf(&b, "  --%s", name)
			if arg != "" {
				b.WriteString(" " + arg)
			}
			fmt.Fprintf(&b, "\n      %s", usage)
			if f.DefValue != "" && f.DefValue != "[]" && !cliOnly(name) && !strings.Contains(usage, "(default") {
				fmt.Fprintf(&b, " (default %s)", f.DefValue)
			}
			if cliOnly(name) {
				b.WriteString("\n")
				continue
			}
			fmt.Fprintf(&b, "\n      env %s\n", envName(name))
		}
	}
	io.WriteString(w, b.String())
}
