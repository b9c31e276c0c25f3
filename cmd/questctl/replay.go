package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/replay"
	"github.com/questrt/questrt/shard"
)

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("replay", `Usage: questctl replay --in case.json [--selector quest|oracle|recent|dense] [--out result.json]
                      [--cp N --tp M --selection exact|union|replicated --placement striped|contiguous]
                      [--backend cuda [--dtype f32|f16|bf16] [--device-resident]]

Runs one saved request (one sequence, one layer; format in README.md) on a
single CPU shard, or on CP x TP in-process shards, and writes the result
JSON: selected pages per query head,
output, lse, page scores, and recall / mass recall / relative L2 error
against dense attention on the same data. Bad input files give a one-line
error and exit status 2.`)
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
	if err := parse(fs, args, stdout); err != nil {
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
