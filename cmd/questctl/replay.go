package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/readlimit"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/replay"
)

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "gen" {
		return runReplayGen(args[1:], stdout, stderr)
	}
	return runCommand(ctx, replayCommand, args, stdout, stderr)
}

// maxReplayTimeout bounds replay's --timeout.
const maxReplayTimeout = time.Hour

// replayCommand builds the flags and the action of
// 'questctl replay' without running it (see [runCommand]).
func replayCommand() (*flag.FlagSet, action) {
	fs := newFlags("replay", `Usage: questctl replay --in case.json [--selector quest|oracle|recent|dense] [--out result.json]
                      [--cp N --tp M --selection exact|union|replicated --placement striped|contiguous]
                      [--backend cuda --kv-cache-dtype f32|f16|bf16 [--device-resident]] [--max-memory BYTES]
       questctl replay --addr HOST:PORT --in case.json [--selector ...] [--cp N --tp M --selection ...]
       questctl replay gen [flags]   (writes a generated case; see 'questctl replay gen --help')

Runs one saved request (one sequence, one layer; format in README.md) on a
single CPU shard, or on CP x TP in-process shards (at most one CP rank per
page), and writes the result JSON: selected pages per query head, output,
lse, page scores, and recall / mass recall / relative and absolute L2 error
against dense attention on the same data (rel_l2 is null when the dense
output is zero and Quest's is not). Bad input files (values whose scores or
sums could overflow float32 included; a case file is read up to 1/32 of
--max-memory, at most 1 GiB), an --out that cannot be created, and runs
that would not fit --max-memory, give a one-line error and exit status 2.
With --backend cuda, --kv-cache-dtype must be given: f32 reproduces the
CPU backend's result (a case holds float32 K and V); f16 and bf16 (the
default of the other commands) round K and V before the run.

With --addr the case runs through a questd cluster (questctl up): one
sequence created through that node with the case's own geometry and
policy and the --cp x --tp grid and --selection mode (whatever the
cluster's defaults), placed on the cluster's nodes; the same result JSON
as in process.`)
	in := fs.String("in", "", "case file (JSON); - reads stdin")
	out := fs.String("out", "", "result file (default stdout)")
	selName := fs.String("selector", "quest", "page selector: quest, oracle, recent or dense")
	cp, tp := new(int), new(int)
	*cp, *tp = 1, 1
	gridFlags(fs, cp, tp, "context-parallel shards, 1..the case's pages", "tensor-parallel shards, 1..kv_heads, dividing the case's kv_heads")
	selection := fs.String("selection", "exact", "CP selection: exact, union or replicated (replicated needs --selector quest or dense)")
	placement := fs.String("placement", "striped", "page placement over CP ranks: striped or contiguous")
	backend := fs.String("backend", "cpu", "kernel backend: cpu, or cuda in a -tags cuda build on a GPU host")
	dtype := kvCacheDTypeFlag(fs, "; replay --backend cuda needs it given: f32 reproduces the CPU backend's result, f16 and bf16 round the case's K and V first")
	deviceResident := fs.Bool("device-resident", false, "cuda: keep the pages and page tables only in GPU memory (appends, copies and rescans run on the device)")
	maxMem := maxMemoryFlag(fs)
	addr := fs.String("addr", "", "run through the questd node at host:port (plaintext, or TLS with --tls-dir or --ca, --tls-cert and --tls-key; see above)")
	timeout := fs.Duration("timeout", 30*time.Second, fmt.Sprintf("with --addr: deadline of the whole run (above 0, at most %v)", maxReplayTimeout))
	conn := addConnFlags(fs)
	tokenFile := tokenFileFlag(fs)
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		switch *backend {
		case "cpu":
			if *deviceResident {
				return usageError{errors.New("--device-resident needs --backend cuda (the CPU backend has no device memory)")}
			}
			if name := givenAs(fs, "kv-cache-dtype"); name != "" {
				return usageError{fmt.Errorf("%s needs --backend cuda (the CPU backend stores float32)", name)}
			}
		case "cuda":
			// A case holds float32 K and V, and replay reproduces the CPU
			// backend's result: the default storage type of the other
			// commands (bf16) would round them, so the type is asked for.
			if !flagSet(fs, "kv-cache-dtype") {
				return usageError{errors.New("--backend cuda: give --kv-cache-dtype: f32 reproduces the CPU backend's result (a case holds float32 K and V); f16 or bf16 (the default of demo and bench attention) round them first")}
			}
		default:
			return usageError{fmt.Errorf("unknown backend %q (want cpu or cuda)", *backend)}
		}
		sel, err := plan.ParseSelector(*selName)
		if err != nil {
			return usageError{err}
		}
		selMode, err := engine.ParseSelection(*selection)
		if err != nil {
			return usageError{err}
		}
		place, err := plan.ParsePlacement(*placement)
		if err != nil {
			return usageError{err}
		}
		if selMode == engine.Replicated && sel != plan.Quest && sel != plan.Dense {
			// At any --cp, as demo refuses it (every rank selects alone from
			// the quest bounds or reads all pages).
			return usageError{fmt.Errorf("--selection replicated: want --selector quest or dense, not %s", sel)}
		}
		if *timeout <= 0 || *timeout > maxReplayTimeout {
			return usageError{fmt.Errorf("--timeout %v: want above 0 and at most %v", *timeout, maxReplayTimeout)}
		}
		if *in == "" {
			return usageError{errors.New("--in is required")}
		}
		var r io.Reader = os.Stdin
		if *in != "-" {
			// A regular file over the read limit is refused from its
			// size, before any of it is read (DecodeLimit bounds a pipe).
			limit, why, err := replay.InputLimit(*maxMem)
			if err != nil {
				return usageError{err}
			}
			f, err := readlimit.Open(*in, limit)
			if errors.Is(err, readlimit.ErrTooLarge) {
				return usageError{fmt.Errorf("--in %s: %w (the limit: %s)", *in, errors.Unwrap(err), why)}
			}
			if err != nil {
				return usageError{err}
			}
			defer f.Close()
			r = f
		}
		// The case is read from at most 1/32 of --max-memory (see
		// replay.InputLimit), so that --cp and --tp are checked against its
		// pages and KV heads.
		c, err := replay.DecodeLimit(r, *maxMem)
		if err != nil {
			return usageError{err}
		}
		if p := c.Pages(); *cp < 1 || *cp > p {
			return usageError{fmt.Errorf("--cp %d: want 1..%d (at most one CP rank per page: the case has %d pages)", *cp, p, p)}
		}
		if *tp < 1 || *tp > c.KVHeads || c.KVHeads%*tp != 0 {
			return usageError{fmt.Errorf("--tp %d: want 1..%d, a divisor of the case's kv_heads %d", *tp, c.KVHeads, c.KVHeads)}
		}
		if *addr != "" {
			if *backend != "cpu" || *deviceResident {
				return usageError{errors.New("--addr: the cluster's nodes choose their backend; drop --backend and --device-resident")}
			}
			token, err := readTokenFile(*tokenFile)
			if err != nil {
				return err
			}
			return replayCluster(ctx, c, *addr, conn, token, *timeout, sel, place, *cp, *tp, selMode, *out, stdout)
		}
		opts := replay.Options{Selector: sel, CP: *cp, TP: *tp, Selection: selMode, Placement: place,
			DeviceResident: *deviceResident, MemoryLimit: *maxMem}
		if err := c.Check(opts); err != nil {
			return usageError{err}
		}
		// An --out that cannot be created is bad input (exit 2, as for replay
		// gen), found before the run.
		w := stdout
		var outFile *os.File
		if *out != "" {
			if outFile, err = os.Create(*out); err != nil {
				return usageError{outError(*out, err)}
			}
			defer outFile.Close() // after a failure; the success path closes it below
			w = outFile
		}
		fail := func(err error) error {
			if outFile != nil {
				outFile.Close()
				os.Remove(*out) // no partial or empty result file
			}
			return err
		}
		if *backend == "cuda" {
			be, err := newCUDABackend(*dtype)
			if err != nil {
				return fail(err)
			}
			defer be.Close()
			opts.Backend = be
		}
		res, err := replay.Run(ctx, c, opts)
		if err != nil {
			return fail(err)
		}
		if err := res.Encode(w); err != nil {
			return fail(err)
		}
		if outFile != nil {
			if err := outFile.Close(); err != nil {
				return fail(err)
			}
		}
		return nil
	}
}

// runReplayGen writes a generated case (replay.Generate) to --out or
// stdout.
func runReplayGen(args []string, stdout, stderr io.Writer) error {
	return runCommand(context.Background(), replayGenCommand, args, stdout, stderr)
}

// replayGenCommand builds the flags and the action of
// 'questctl replay gen' without running it (see [runCommand]).
func replayGenCommand() (*flag.FlagSet, action) {
	g := replay.GenConfig{Tokens: 256, PageSize: 16, BudgetTokens: 64, QHeads: 4, KVHeads: 2, HeadDim: 16, GQA: "group_max", Seed: 1}
	fs := newFlags("replay gen", `Usage: questctl replay gen [--tokens N] [--q-heads H] [--kv-heads G] [--head-dim D]
                          [--page-size S] [--budget B] [--gqa group_max|per_head]
                          [--sink-pages N] [--local-pages N] [--seed N] [--out case.json]

Writes a random replay case of the given geometry: keys Gaussian with a
per-page offset per KV head, values Gaussian, the query Gaussian with scale
2. The output is a pure function of the flags (the same flags and seed give
the same bytes). The defaults make examples/replay/case.json. A geometry
whose case, or whose single-shard replay, would not fit --max-memory is
refused before anything is allocated.`)
	fs.IntVar(&g.Tokens, "tokens", g.Tokens, fmt.Sprintf("tokens of the sequence, 1..%d", replay.MaxGenTokens))
	fs.IntVar(&g.QHeads, "q-heads", g.QHeads, fmt.Sprintf("query heads, 1..%d, a multiple of --kv-heads", replay.MaxGenHeads))
	fs.IntVar(&g.KVHeads, "kv-heads", g.KVHeads, fmt.Sprintf("KV heads, 1..%d, dividing --q-heads", replay.MaxGenHeads))
	fs.IntVar(&g.HeadDim, "head-dim", g.HeadDim, fmt.Sprintf("head dimension D, 1..%d", replay.MaxGenHeadDim))
	fs.IntVar(&g.PageSize, "page-size", g.PageSize, fmt.Sprintf("tokens per page S, 1..%d", replay.MaxGenTokens))
	fs.IntVar(&g.BudgetTokens, "budget", g.BudgetTokens, fmt.Sprintf("token budget B, --page-size..%d (page budget K = B/S, forced pages included)", replay.MaxGenTokens))
	fs.StringVar(&g.GQA, "gqa", g.GQA, "GQA page sharing: group_max or per_head")
	fs.IntVar(&g.SinkPages, "sink-pages", g.SinkPages, "forced first pages, 0..K - --local-pages")
	fs.IntVar(&g.LocalPages, "local-pages", g.LocalPages, "forced last pages, 0..K - --sink-pages")
	fs.Uint64Var(&g.Seed, "seed", g.Seed, "data seed, 0..18446744073709551615")
	out := fs.String("out", "", "case file to write (default stdout)")
	maxMem := maxMemoryFlag(fs)
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		if err := g.Check(*maxMem); err != nil {
			return usageError{err}
		}
		c := replay.Generate(g)
		if *out == "" {
			return c.Encode(stdout)
		}
		f, err := os.Create(*out)
		if err != nil {
			return usageError{outError(*out, err)}
		}
		if err := c.Encode(f); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
}

// outError is the one-line usage error for an --out file that cannot be
// created: "--out PATH: cannot create it: no such file or directory".
func outError(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("--out %s: cannot create it: %w", path, err)
}

// replayCluster runs case c through the node at addr, connected as conn
// says.
func replayCluster(ctx context.Context, c *replay.Case, addr string, conn *connFlags, token string, timeout time.Duration, sel plan.Selector,
	place plan.Placement, cp, tp int, mode engine.Selection, out string, stdout io.Writer) error {
	w := stdout
	if out != "" {
		// An --out that cannot be created is bad input, found before the run.
		f, err := os.Create(out)
		if err != nil {
			return usageError{outError(out, err)}
		}
		defer f.Close()
		w = f
	}
	fail := func(err error) error {
		if out != "" {
			os.Remove(out) // no partial or empty result file
		}
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cl, err := conn.dial(ctx, addr, token)
	if err != nil {
		return fail(fmt.Errorf("--addr %q: %w", addr, err))
	}
	defer cl.Close()
	res, err := replay.RunCluster(ctx, c, replay.Options{Selector: sel, CP: cp, TP: tp, Selection: mode, Placement: place}, cl)
	if err != nil {
		return fail(err)
	}
	if err := res.Encode(w); err != nil {
		return fail(err)
	}
	return nil
}
