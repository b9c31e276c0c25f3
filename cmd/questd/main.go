// Command questd is the questrt node daemon. It is not built yet: this
// placeholder prints a message and exits with status 2.
//
// The planned daemon discovers the node's devices, joins the cluster
// (memberlist gossip), hosts the node's shards and serves the gRPC API,
// shard-to-shard collectives and Prometheus /metrics. See the roadmap in
// README.md.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), `usage: questd

questd is the questrt node daemon (planned, not built yet). Once built it
will discover the node's GPUs, join the cluster by memberlist gossip, host
this node's KV shards, and serve the gRPC API, shard-to-shard collectives
and /metrics. Today it only prints this notice; use questctl for the
in-process demo, replay and benchmarks.
`)
	}
	flag.Parse()
	fmt.Fprintln(os.Stderr, "questd: the node daemon is not built yet; see README roadmap")
	os.Exit(2)
}
