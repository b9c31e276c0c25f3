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

	"github.com/questrt/questrt/internal/memlimit"
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

// newFlags makes a subcommand's flag set. Parse errors are returned, not
// printed; --help prints synopsis and flags to stdout (see [parse]).
func newFlags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "%s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args into fs. --help prints the command's usage to stdout
// and returns flag.ErrHelp (exit 0); a bad flag or a stray argument is a
// one-line usage error (exit 2).
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fs.Usage()
			fs.SetOutput(io.Discard)
			return err
		}
		return usageError{fmt.Errorf("%v (see 'questctl %s --help')", err, fs.Name())}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q (see 'questctl %s --help')", fs.Args(), fs.Name())}
	}
	return nil
}

// maxMemoryFlag adds --max-memory to fs: the bytes a command may allocate
// for its data, checked from the configuration's geometry before anything
// is allocated.
func maxMemoryFlag(fs *flag.FlagSet) *int64 {
	limit := memlimit.Auto
	fs.Func("max-memory", "most memory the command may allocate, e.g. 4GiB or 512MiB (0: the memory available now; -1: no check); larger configurations are refused before allocating", func(s string) error {
		v, err := memlimit.ParseBytes(s)
		if err != nil {
			return err
		}
		limit = v
		return nil
	})
	return &limit
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
