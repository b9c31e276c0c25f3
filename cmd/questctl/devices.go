package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/cluster"
)

func runDevices(args []string, stdout, stderr io.Writer) error {
	return runCommand(context.Background(), devicesCommand, args, stdout, stderr)
}

// devicesCommand builds the flags and the action of
// 'questctl devices' without running it (see [runCommand]).
func devicesCommand() (*flag.FlagSet, action) {
	fs := newFlags("devices", `Usage: questctl devices [--json]

Lists this node's NVIDIA GPUs through NVML (go-nvml): index, name, UUID,
memory, PCI bus id, active NVLink links and the pairwise topology. Without
NVML or a GPU it says so once; questrt then runs on the CPU backend.
Discovery is in builds with -tags nvml or -tags cuda (go-nvml needs cgo);
the default build is pure Go and reports that it has none.

With --json it prints one JSON object, always: {"driver", "gpus",
"topology"} and, when no GPU is available, "gpus": [] and "reason".`)
	asJSON := fs.Bool("json", false, "print the inventory as one JSON object")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		inv, err := cluster.Discover()
		if errors.Is(err, cluster.ErrNoNVML) {
			if *asJSON {
				return bench.WriteJSONLine(stdout, struct {
					cluster.Inventory
					Reason string `json:"reason"`
				}{cluster.Inventory{GPUs: []cluster.GPU{}, Topology: [][]string{}}, err.Error()})
			}
			if errors.Is(err, cluster.ErrNoDiscovery) {
				fmt.Fprintln(stdout, "this build has no GPU discovery (go-nvml needs cgo: build with -tags nvml or -tags cuda); questrt runs on the CPU backend")
				return nil
			}
			fmt.Fprintf(stdout, "no NVIDIA GPU found (%v): questrt runs on the CPU backend\n", err)
			return nil
		}
		if err != nil {
			return err
		}
		if *asJSON {
			return bench.WriteJSONLine(stdout, inv)
		}
		fmt.Fprintf(stdout, "driver %s, %d GPU(s)\n", inv.Driver, len(inv.GPUs))
		for _, g := range inv.GPUs {
			fmt.Fprintf(stdout, "  %d  %-24s %s  %s  %.1f GiB (%.1f free)  nvlinks %d\n",
				g.Index, g.Name, g.UUID, g.PCIBusID, float64(g.MemoryTotal)/(1<<30), float64(g.MemoryFree)/(1<<30), g.NVLinks)
		}
		for i, row := range inv.Topology {
			fmt.Fprintf(stdout, "  topology %d: %v\n", i, row)
		}
		return nil
	}
}
