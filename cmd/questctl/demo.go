package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/questrt/questrt/client"

	"github.com/questrt/questrt/cmd/questctl/internal/demo"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, demoCommand, args, stdout, stderr)
}

// demoCommand builds the flags and the action of
// 'questctl demo' without running it (see [runCommand]).
func demoCommand() (*flag.FlagSet, action) {
	c := demo.DefaultConfig()
	fs := newFlags("demo", `Usage: questctl demo [flags]

Builds a synthetic long context on the CPU in which many keys mention
entity A and a few early "needle" keys mention entity B, then decodes:
the first half of the steps ask about A, the second half turn to B (the
relevance reversal that eviction policies fail). Every sparse layer runs a
Quest step with diagnostics (appending the new token), a dense step and
the Quest step again as a server runs it (timed) on the same data, and
prints pages read vs total, bytes read vs rho = 1/S + K/P, recall of the
dense top-10 tokens, attention-mass recall, output relative L2 error,
phase times, the collectives' share of the step and the Quest-vs-dense
speedup. --cp and
--tp lay the KV out over in-process shards; --backend cuda (a -tags cuda
build on a GPU host) runs the kernels on GPU 0, with --device-resident
keeping the pages and page tables only in GPU memory.

Before allocating, the demo computes the host memory it needs (page pools
of every shard, synthetic data, step and diagnostics scratch) and refuses
a configuration over --max-memory. It also refuses configurations that
would measure nothing: no sparse layer left (--dense-layers >= --layers),
a budget covering the context (every layer dense), or needles and
mentions that do not fit the context.

With --nodes N the demo starts a local cluster of N questd processes (as
questctl up does: --questd, else questd next to questctl, else on $PATH;
their logs go to a temporary folder, named on failure), runs the same
decode through the client API of the first node (the sequence's CP x TP
ranks placed on the nodes), and stops the nodes at the end. Recall and
mass recall there read the keys back from the nodes (diagnostics only).`)
	fs.IntVar(&c.Context, "context", c.Context, "tokens of prefilled context (longer than --budget; up to 2^30, within --max-memory)")
	fs.IntVar(&c.Steps, "steps", c.Steps, "decode steps, 1..100000 (the query turns from A to B halfway)")
	fs.IntVar(&c.Layers, "layers", c.Layers, "layers, 1..1024")
	fs.IntVar(&c.DenseLayers, "dense-layers", c.DenseLayers, "leading layers that always attend densely (0: none; below --layers)")
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, "query heads, 1..1024, a multiple of --kv-heads")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads, 1..1024, dividing --q-heads")
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, "head dimension D, 1..4096")
	fs.IntVar(&c.PageSize, "page-size", c.PageSize, "tokens per page S, 1..1073741824 (at most --budget)")
	fs.IntVar(&c.Budget, "budget", c.Budget, "token budget B per head (page budget K = B/S), 1..1073741824; at least one page and below --context")
	fs.IntVar(&c.Needles, "needles", c.Needles, "needle keys of entity B, 1..1073741824, each on its own page in the context's first quarter")
	fs.IntVar(&c.Mentions, "mentions", c.Mentions, "keys of entity A, 1..1073741824, at most one per page")
	fs.StringVar(&c.GQA, "gqa", c.GQA, "GQA page sharing: group_max or per_head")
	fs.StringVar(&c.Selector, "selector", c.Selector, "page selector: quest, oracle, recent or dense")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "data seed (any value, 0 included)")
	fs.IntVar(&c.Workers, "workers", c.Workers, "CPU kernel worker goroutines besides the caller, 0..256 (0: GOMAXPROCS-1)")
	gridFlags(fs, &c.CP, &c.TP, "context-parallel shards, 1..256 (pages striped over them; at most one shard per page)",
		"tensor-parallel shards (KV heads split over them; divides --kv-heads)")
	fs.StringVar(&c.Selection, "selection", c.Selection, "CP selection: exact, union or replicated")
	backend := fs.String("backend", "cpu", "kernel backend: cpu, or cuda in a -tags cuda build on a GPU host")
	dtype := kvCacheDTypeFlag(fs, "")
	summary := summaryDTypeFlag(fs, "; in process only (not with --nodes)")
	fs.BoolVar(&c.DeviceResident, "device-resident", false, "cuda: keep the pages and page tables only in GPU memory")
	maxMem := maxMemoryFlag(fs)
	nodes := fs.Int("nodes", 0, fmt.Sprintf("run through a local cluster of this many questd processes, 0..%d (0: in process)", maxLocalNodes))
	questd := fs.String("questd", "", "with --nodes: the questd binary (default: questd next to questctl, else on $PATH)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		c.MemoryLimit = *maxMem
		c.Progress = stderr
		if *nodes < 0 || *nodes > maxLocalNodes {
			return usageError{fmt.Errorf("--nodes %d: want 0 (in process) or 1..%d questd processes on this host", *nodes, maxLocalNodes)}
		}
		if err := c.Validate(); err != nil {
			return usageError{err}
		}
		switch *backend {
		case "cpu":
			if c.DeviceResident {
				return usageError{errors.New("--device-resident needs --backend cuda (the CPU backend has no device memory)")}
			}
			if name := givenAs(fs, "kv-cache-dtype"); name != "" {
				return usageError{fmt.Errorf("%s needs --backend cuda (the CPU backend stores float32)", name)}
			}
			if sd := summary.types[0]; sd != plan.SummaryKV && *nodes == 0 {
				cpu := kernels.NewCPU(kernels.CPUConfig{Workers: c.Workers, SummaryDType: sd})
				defer cpu.Close()
				c.Backend = cpu
				c.SummaryWeight = fp8SummaryWeight(c.HeadDim, c.PageSize, 4) // K/V float32
			}
		case "cuda":
			be, err := newCUDABackendSummary(*dtype, summary.types[0])
			if err != nil {
				return err
			}
			if summary.types[0] == plan.SummaryFP8 {
				dt, _ := plan.ParseDType(*dtype) // parsed by newCUDABackendSummary
				c.SummaryWeight = fp8SummaryWeight(c.HeadDim, c.PageSize, dt.Bytes())
			}
			defer be.Close()
			c.Backend = be
		default:
			return usageError{fmt.Errorf("unknown backend %q (want cpu or cuda)", *backend)}
		}
		if *nodes > 0 && *backend != "cpu" {
			return usageError{fmt.Errorf("--nodes %d: want 0 (in process) or a cluster size with the cpu backend", *nodes)}
		}
		if *nodes > 0 && summary.types[0] != plan.SummaryKV {
			return usageError{errors.New("--summary-dtype fp8 runs in process only: drop --nodes")}
		}
		if *nodes > 0 {
			return demoCluster(ctx, c, *nodes, *questd, stdout, stderr)
		}
		_, err := demo.Run(ctx, c, stdout)
		return err
	}
}

// demoCluster runs the demo through a local cluster of n questd nodes.
func demoCluster(ctx context.Context, c demo.Config, n int, questd string, stdout, stderr io.Writer) error {
	bin, err := findQuestd(questd)
	if err != nil {
		return err
	}
	logs, err := os.MkdirTemp("", "questrt-demo-logs-")
	if err != nil {
		return err
	}
	ec := c.Engine()
	p := ec.Policy
	common := []string{"--plaintext", "--cp", fmt.Sprint(ec.CP), "--tp", fmt.Sprint(ec.TP),
		"--layers", fmt.Sprint(ec.Layers), "--q-heads", fmt.Sprint(ec.QHeads), "--kv-heads", fmt.Sprint(ec.KVHeads),
		"--head-dim", fmt.Sprint(ec.HeadDim), "--page-size", fmt.Sprint(ec.PageSize),
		"--capacity-pages", fmt.Sprint(ec.CapacityPages), "--max-pages", fmt.Sprint(ec.CapacityPages * ec.CP * ec.TP),
		"--budget-tokens", fmt.Sprint(p.BudgetTokens), "--sink-pages", fmt.Sprint(p.SinkPages),
		"--local-pages", fmt.Sprint(p.LocalPages), "--dense-layers", fmt.Sprint(p.DenseLayers),
		"--gqa", p.GQA.String(), "--selector", p.Selector.String(), "--selection", ec.Selection.String(),
		"--step-timeout", "60s", "--max-memory", "none"}
	errw := &syncWriter{w: stderr}
	cl := &upCluster{bin: bin, plaintext: true, logDir: logs, stderr: errw, exited: make(chan *upNode, n)}
	defer cl.stop(10 * time.Second)
	fmt.Fprintf(stderr, "demo: starting %d questd nodes (logs in %s)\n", n, logs)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = cl.start(sctx, "demo", n, common)
	cancel()
	if err != nil {
		return fmt.Errorf("--nodes %d: %w (logs in %s)", n, err, logs)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cc, err := client.Dial(dctx, cl.nodes[0].grpc, client.Options{})
	cancel()
	if err != nil {
		return fmt.Errorf("--nodes %d: %w (logs in %s)", n, err, logs)
	}
	defer cc.Close()
	c.Cluster = cc
	if _, err := demo.Run(ctx, c, stdout); err != nil {
		return fmt.Errorf("%w (node logs in %s)", err, logs)
	}
	os.RemoveAll(logs)
	return nil
}

// fp8SummaryWeight is demo.Config.SummaryWeight for fp8 summaries: a
// record's 2D codes and 4-byte scale over one page's K and V for the head
// (2 S D values of kvBytes each).
func fp8SummaryWeight(d, s, kvBytes int) float64 {
	return float64(2*d+4) / float64(2*s*d*kvBytes)
}
