// Command questctl is the questrt command-line tool: it runs the demo,
// replays saved requests and runs benchmarks. It holds no business logic:
// each subcommand parses flags and calls a package.
//
//	questctl demo     [flags]   synthetic long-context decode, Quest vs dense
//	questctl replay   --in case.json [--selector ...] [--out result.json]
//	questctl bench    attention|collective [flags]
//	questctl devices  [--json]
//
// Run `questctl <command> --help` for a command's flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/demo"
	"github.com/questrt/questrt/replay"
	"github.com/questrt/questrt/shard"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and failed
	exitUsage   = 2 // bad flags or bad input files
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `questctl: the questrt command-line tool (Quest query-aware KV-page sparsity)

Usage:
  questctl demo   [flags]               synthetic long context decoded with Quest and dense side by side (CPU)
  questctl replay --in case.json [...]  run one saved request (one sequence, one layer) and print the result JSON
  questctl bench  attention [flags]     one-layer Quest vs dense attention benchmark, JSON lines
  questctl bench  collective [flags]    latency of the CP selection exchange and merge, JSON lines
  questctl bench  selection [flags]     exact vs union vs replicated CP selection on the same data, JSON lines
  questctl devices [--json]             the node's NVIDIA GPUs (NVML): name, UUID, memory, PCI, NVLink, topology

Run 'questctl <command> --help' for the flags of a command.
`

// usageError marks errors that exit with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var err error
	switch args[0] {
	case "demo":
		err = runDemo(ctx, args[1:], stdout, stderr)
	case "replay":
		err = runReplay(ctx, args[1:], stdout, stderr)
	case "bench":
		err = runBench(ctx, args[1:], stdout, stderr)
	case "devices":
		err = runDevices(args[1:], stdout, stderr)
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "questctl: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "questctl %s: %v\n", args[0], err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "questctl %s: %v\n", args[0], err)
		return exitFailure
	}
}

func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	return nil
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
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
keeping the pages and page tables only in GPU memory.`, stderr)
	fs.IntVar(&c.Context, "context", c.Context, "tokens of prefilled context")
	fs.IntVar(&c.Steps, "steps", c.Steps, "decode steps (the query turns from A to B halfway)")
	fs.IntVar(&c.Layers, "layers", c.Layers, "layers")
	fs.IntVar(&c.DenseLayers, "dense-layers", c.DenseLayers, "leading layers that always attend densely")
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, "query heads")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads")
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, "head dimension D")
	fs.IntVar(&c.PageSize, "page-size", c.PageSize, "tokens per page S")
	fs.IntVar(&c.Budget, "budget", c.Budget, "token budget B per head (page budget K = B/S)")
	fs.IntVar(&c.Needles, "needles", c.Needles, "needle keys of entity B")
	fs.IntVar(&c.Mentions, "mentions", c.Mentions, "keys of entity A")
	fs.StringVar(&c.GQA, "gqa", c.GQA, "GQA page sharing: group_max or per_head")
	fs.StringVar(&c.Selector, "selector", c.Selector, "page selector: quest, oracle, recent or dense")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "data seed")
	fs.IntVar(&c.Workers, "workers", c.Workers, "CPU kernel worker goroutines besides the caller (0: GOMAXPROCS-1)")
	fs.IntVar(&c.CP, "cp", c.CP, "context-parallel shards (pages striped over them)")
	fs.IntVar(&c.TP, "tp", c.TP, "tensor-parallel shards (KV heads split over them)")
	fs.StringVar(&c.Selection, "selection", c.Selection, "CP selection: exact, union or replicated")
	backend := fs.String("backend", "cpu", "kernel backend: cpu, or cuda in a -tags cuda build on a GPU host")
	dtype := fs.String("dtype", "bf16", "cuda storage type: f32, f16 or bf16 (the CPU backend is f32)")
	fs.BoolVar(&c.DeviceResident, "device-resident", false, "cuda: keep the pages and page tables only in GPU memory")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return usageError{err}
	}
	switch *backend {
	case "cpu":
		if c.DeviceResident {
			return usageError{errors.New("--device-resident needs --backend cuda (the CPU backend has no device memory)")}
		}
		dtypeSet := false
		fs.Visit(func(f *flag.Flag) { dtypeSet = dtypeSet || f.Name == "dtype" })
		if dtypeSet {
			return usageError{errors.New("--dtype needs --backend cuda (the CPU backend stores float32)")}
		}
	case "cuda":
		be, err := newCUDABackend(*dtype)
		if err != nil {
			return err
		}
		defer be.Close()
		c.Backend = be
	default:
		return usageError{fmt.Errorf("unknown backend %q (want cpu or cuda)", *backend)}
	}
	_, err := demo.Run(ctx, c, stdout)
	return err
}

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("replay", `Usage: questctl replay --in case.json [--selector quest|oracle|recent|dense] [--out result.json]
                      [--cp N --tp M --selection exact|union|replicated --placement striped|contiguous]
                      [--backend cuda [--dtype f32|f16|bf16] [--device-resident]]

Runs one saved request (one sequence, one layer; format in README.md) on a
single CPU shard, or on CP x TP in-process shards, and writes the result
JSON: selected pages per query head,
output, lse, page scores, and recall / mass recall / relative L2 error
against dense attention on the same data. Bad input files give a one-line
error and exit status 2.`, stderr)
	in := fs.String("in", "", "case file (JSON); - reads stdin")
	out := fs.String("out", "", "result file (default stdout)")
	selName := fs.String("selector", "quest", "page selector: quest, oracle, recent or dense")
	cp := fs.Int("cp", 1, "context-parallel shards")
	tp := fs.Int("tp", 1, "tensor-parallel shards (must divide kv_heads)")
	selection := fs.String("selection", "exact", "CP selection: exact, union or replicated")
	placement := fs.String("placement", "striped", "page placement over CP ranks: striped or contiguous")
	backend := fs.String("backend", "cpu", "kernel backend: cpu, or cuda in a -tags cuda build on a GPU host")
	dtype := fs.String("dtype", "f32", "cuda storage type: f32, f16 or bf16")
	deviceResident := fs.Bool("device-resident", false, "cuda: keep the pages and page tables only in GPU memory (appends, copies and rescans run on the device)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *cp < 1 || *tp < 1 {
		return usageError{fmt.Errorf("--cp %d and --tp %d must be positive", *cp, *tp)}
	}
	if *deviceResident && *backend != "cuda" {
		return usageError{errors.New("--device-resident needs --backend cuda (the CPU backend has no device memory)")}
	}
	sel, err := shard.ParseSelector(*selName)
	if err != nil {
		return usageError{err}
	}
	selMode, err := engine.ParseSelection(*selection)
	if err != nil {
		return usageError{err}
	}
	place, err := engine.ParsePlacement(*placement)
	if err != nil {
		return usageError{err}
	}
	if *in == "" {
		return usageError{errors.New("--in is required")}
	}
	var r io.Reader = os.Stdin
	if *in != "-" {
		f, err := os.Open(*in)
		if err != nil {
			return usageError{err}
		}
		defer f.Close()
		r = f
	}
	c, err := replay.Decode(r)
	if err != nil {
		return usageError{err}
	}
	if c.KVHeads%*tp != 0 {
		return usageError{fmt.Errorf("--tp %d does not divide kv_heads %d", *tp, c.KVHeads)}
	}
	opts := replay.Options{Selector: sel, CP: *cp, TP: *tp, Selection: selMode, Placement: place, DeviceResident: *deviceResident}
	switch *backend {
	case "cpu":
	case "cuda":
		be, err := newCUDABackend(*dtype)
		if err != nil {
			return err
		}
		defer be.Close()
		opts.Backend = be
	default:
		return usageError{fmt.Errorf("unknown backend %q (want cpu or cuda)", *backend)}
	}
	res, err := replay.Run(ctx, c, opts)
	if err != nil {
		return err
	}
	if *out == "" {
		return res.Encode(stdout)
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	if err := res.Encode(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New("want a benchmark name: attention, collective or selection")}
	}
	switch args[0] {
	case "attention":
		return runBenchAttention(ctx, args[1:], stdout, stderr)
	case "collective":
		return runBenchCollective(ctx, args[1:], stdout, stderr)
	case "selection":
		return runBenchSelection(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, "Usage: questctl bench attention|collective|selection [flags]\n\nRun 'questctl bench <name> --help' for its flags.\n")
		return nil
	}
	return usageError{fmt.Errorf("unknown benchmark %q (want attention, collective or selection)", args[0])}
}

func runBenchCollective(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := collective.DefaultBenchConfig()
	fs := newFlags("bench collective", `Usage: questctl bench collective [flags]

Per layer-step latency of the collectives of a CP group: the exact
selection exchange (all-gather of each rank's local top-K candidates, every
rank derives the same global top-K) and the merge of partial states to
rank 0, on N goroutines over the chosen transport. Prints one JSON line per
(shards, batch) with p50/p95/p99 latencies in microseconds and bytes sent.`, stderr)
	shards := fs.String("shards", "2,4,8,16", "comma-separated CP group sizes")
	batches := fs.String("batch", "1,16", "comma-separated batch sizes")
	fs.StringVar(&c.Transport, "transport", c.Transport, "transport: inproc")
	fs.IntVar(&c.Steps, "steps", c.Steps, "measured layer-steps per configuration")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads (selection rows per sequence)")
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, "query heads (merged states per sequence)")
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, "head dimension D")
	fs.IntVar(&c.PageBudget, "k", c.PageBudget, "pages selected per row (K)")
	asJSON := fs.Bool("json", false, "print JSON lines only (default also prints a table to stderr)")
	if err := parse(fs, args); err != nil {
		return err
	}
	var err error
	if c.Shards, err = intList(*shards); err != nil {
		return usageError{fmt.Errorf("--shards: %w", err)}
	}
	if c.Batches, err = intList(*batches); err != nil {
		return usageError{fmt.Errorf("--batch: %w", err)}
	}
	if err := c.Validate(); err != nil {
		return usageError{err}
	}
	res, err := collective.BenchCollective(ctx, c)
	for _, r := range res {
		if !*asJSON {
			fmt.Fprintf(stderr, "shards %2d batch %2d: select p50 %.1f p99 %.1f us, merge p50 %.1f p99 %.1f us, %d + %d bytes/step\n",
				r.Shards, r.Batch, r.SelectP50, r.SelectP99, r.MergeP50, r.MergeP99, r.SelectBytes, r.MergeBytes)
		}
		if werr := bench.WriteJSONLine(stdout, r); werr != nil {
			return werr
		}
	}
	return err
}

func runBenchSelection(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := bench.DefaultSelectionConfig()
	fs := newFlags("bench selection", `Usage: questctl bench selection [flags]

Compares the CP selection modes on the same data and queries: for each CP
degree and mode, one sparse layer of the in-process engine (CPU) is stepped
--steps times; prints one JSON line per (cp, selection) with the median
step time and its score / selection-exchange / merge phases on rank 0, the
pages read, the fraction of query heads whose pages equal exact selection's,
the fraction of exact's pages each mode attended, and the attention-mass
recall against dense attention. The shards share one CPU backend, whose
calls serialize: merge times include waiting for the other ranks' kernels.`, stderr)
	cps := fs.String("cp", "2,4,8", "comma-separated CP degrees")
	modes := fs.String("selection", "exact,union,replicated", "comma-separated modes (put exact first to compare against it)")
	fs.IntVar(&c.Context, "context", c.Context, "tokens of the sequence")
	fs.IntVar(&c.Budget, "budget", c.Budget, "token budget")
	fs.IntVar(&c.PageSize, "page-size", c.PageSize, "tokens per page S")
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, "query heads")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads")
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, "head dimension D")
	fs.IntVar(&c.Steps, "steps", c.Steps, "timed steps per configuration")
	asJSON := fs.Bool("json", false, "print JSON lines only (default also prints a table to stderr)")
	if err := parse(fs, args); err != nil {
		return err
	}
	var err error
	if c.CP, err = intList(*cps); err != nil {
		return usageError{fmt.Errorf("--cp: %w", err)}
	}
	c.Modes = nil
	for _, m := range strings.Split(*modes, ",") {
		sel, err := engine.ParseSelection(strings.TrimSpace(m))
		if err != nil {
			return usageError{err}
		}
		c.Modes = append(c.Modes, sel)
	}
	if c.Context < 1 || c.Steps < 1 || c.Budget < c.PageSize || c.QHeads%c.KVHeads != 0 {
		return usageError{fmt.Errorf("context and steps must be positive, the budget at least one page, and q-heads a multiple of kv-heads")}
	}
	if !*asJSON {
		c.Progress = stderr
	}
	return bench.Selection(ctx, c, func(r bench.SelectionResult) error {
		if !*asJSON {
			fmt.Fprintf(stderr, "cp %d %-10s: step %.0f us (score %.0f, select %.0f, merge %.0f), %.0f pages read, same pages as exact %.3f, exact's pages recalled %.3f, mass recall %.4f\n",
				r.CP, r.Mode, r.StepUS, r.ScoreUS, r.SelectUS, r.MergeUS, r.PagesRead, r.SamePages, r.ExactRecall, r.MassRecall)
		}
		return bench.WriteJSONLine(stdout, r)
	})
}

func runBenchAttention(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := bench.DefaultAttentionConfig()
	fs := newFlags("bench attention", `Usage: questctl bench attention [flags]

One layer, one or more sequences of the full context: a Quest step (score +
top-K + sparse attention) and a dense step on the same data, alternated,
median of --iters. Prints one JSON line per (context, budget) with
dense_us, quest_us, score_us, topk_us, attend_us, bytes_read, bytes_dense,
rho_formula (1/S + K/P) and the machine's copy bandwidth measured in the
same run.

With --backend cuda the data live on the GPU, each phase is timed with CUDA
events from a cold L2 (a 256 MiB write before every call, launches queued
ahead), and the lines add per-phase GB/s, roofline times (bytes over the
copy bandwidth), quest_latency_us (one step launched alone on an idle GPU)
and topk_step_us (the top-K right after the score kernel, as inside a
step).`, stderr)
	backend := fs.String("backend", "cpu", "kernel backend: cpu, or cuda in a -tags cuda build on a GPU host")
	contexts := fs.String("context", "32768,131072", "comma-separated context lengths in tokens")
	budgets := fs.String("budget", "2048", "comma-separated token budgets")
	batches := fs.String("batch", "1", "comma-separated batch sizes (sequences per step)")
	dtype := fs.String("dtype", "bf16", "cuda storage type: f32, f16 or bf16 (the CPU backend is f32)")
	fs.IntVar(&c.PageSize, "page-size", c.PageSize, "tokens per page S")
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, "query heads")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads")
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, "head dimension D")
	fs.IntVar(&c.Iters, "iters", c.Iters, "timed steps per configuration")
	asJSON := fs.Bool("json", false, "print JSON lines only (default also prints a table to stderr)")
	cudaKernels := fs.String("cuda-kernels", "", "cuda: tuning overrides, comma-separated: attend=NAME and score=NAME (tensor-core kernel variants of kernels/cuda/mma.cu), score-chunk=N and attend-chunk=N (pages per block / work item)")
	if err := parse(fs, args); err != nil {
		return err
	}
	var err error
	if c.Contexts, err = intList(*contexts); err != nil {
		return usageError{fmt.Errorf("--context: %w", err)}
	}
	if c.Budgets, err = intList(*budgets); err != nil {
		return usageError{fmt.Errorf("--budget: %w", err)}
	}
	batchList, err := intList(*batches)
	if err != nil {
		return usageError{fmt.Errorf("--batch: %w", err)}
	}
	switch *backend {
	case "cpu":
	case "cuda":
		return benchCUDA(ctx, c, batchList, *dtype, *cudaKernels, *asJSON, stdout, stderr)
	default:
		return usageError{fmt.Errorf("unknown backend %q (want cpu or cuda)", *backend)}
	}
	c.Progress = stderr
	start := time.Now()
	for _, b := range batchList {
		c.Batch = b
		err = bench.Attention(ctx, c, func(r bench.AttentionResult) error {
			if !*asJSON {
				fmt.Fprintf(stderr, "context %d batch %d budget %d: dense %.0f us, quest %.0f us (score %.0f, top-K %.0f, attend %.0f), %.1fx; rho %.4f (formula %.4f); dense %.1f GB/s, copy %.1f GB/s\n",
					r.Context, r.Batch, r.Budget, r.DenseUS, r.QuestUS, r.ScoreUS, r.TopKUS, r.AttendUS, r.Speedup, r.RhoBytes, r.RhoFormula, r.DenseGBps, r.CopyGBps)
			}
			return bench.WriteJSONLine(stdout, r)
		})
		if err != nil {
			return err
		}
	}
	if !*asJSON {
		fmt.Fprintf(stderr, "done in %.1fs\n", time.Since(start).Seconds())
	}
	return nil
}

func runDevices(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("devices", `Usage: questctl devices [--json]

Lists this node's NVIDIA GPUs through NVML (go-nvml): index, name, UUID,
memory, PCI bus id, active NVLink links and the pairwise topology. Without
NVML or a GPU it says so once; questrt then runs on the CPU backend.`, stderr)
	asJSON := fs.Bool("json", false, "print the inventory as JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	inv, err := cluster.Discover()
	if errors.Is(err, cluster.ErrNoNVML) {
		fmt.Fprintf(stdout, "no NVIDIA GPU available (%v): questrt runs on the CPU backend\n", err)
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

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}
