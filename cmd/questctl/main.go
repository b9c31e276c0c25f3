// Command questctl is the questrt command-line tool: it runs the demo,
// replays saved requests and runs benchmarks. It holds no business logic:
// each subcommand parses flags and calls a package.
//
//	questctl demo     [flags]   synthetic long-context decode, Quest vs dense
//	questctl replay   --in case.json [--selector ...] [--out result.json]
//	questctl replay   gen [flags]   write a generated replay case
//	questctl bench    attention|collective|selection [flags]
//	questctl devices  [--json]
//	questctl generate --model DIR --prompt TEXT [flags]
//	questctl eval     passkey --model DIR [flags]
//	questctl calibrate --model DIR --prompts FILE [--out policy.yaml]
//	questctl plot     --in FILE.jsonl[,...] --out FILE.png [--kind passkey|attention|auto]
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
	"regexp"
	"strings"

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
  questctl replay gen [flags]           write a generated replay case (geometry and seed)
  questctl bench  attention [flags]     one-layer Quest vs dense attention benchmark, JSON lines
  questctl bench  collective [flags]    latency of the CP selection exchange and merge, JSON lines
  questctl bench  selection [flags]     exact vs union vs replicated CP selection on the same data, JSON lines
  questctl devices [--json]             the node's NVIDIA GPUs (NVML): name, UUID, memory, PCI, NVLink, topology
  questctl generate --model DIR --prompt TEXT [...]  decode a Llama checkpoint through the engine (Quest or dense): text, pages read vs total, tokens/s
  questctl eval passkey --model DIR [...]            passkey accuracy, recall and attention-mass recall per layer vs dense, JSON lines
  questctl calibrate --model DIR --prompts F [...]   per-layer budgets reaching a target attention-mass recall; writes a --policy file
  questctl plot --in FILE.jsonl --out FILE.png       PNG figure of eval passkey or bench attention JSON lines
  questctl up --nodes N [--cp C --tp T] [-- questd flags]  start a local questd cluster on loopback and keep it up until Ctrl-C
  questctl status --addr HOST:PORT [--json]          one questd's view: members and their state, devices, grid config
  questctl version                                   the version and VCS revision of this build

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
	case "generate":
		err = runGenerate(ctx, args[1:], stdout, stderr)
	case "eval":
		err = runEval(ctx, args[1:], stdout, stderr)
	case "calibrate":
		err = runCalibrate(ctx, args[1:], stdout, stderr)
	case "plot":
		err = runPlot(args[1:], stdout, stderr)
	case "up":
		err = runUp(ctx, args[1:], stdout, stderr)
	case "status":
		err = runStatus(ctx, args[1:], stdout, stderr)
	case "version":
		err = runVersion(args[1:], stdout, stderr)
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "questctl: unknown command %q (want demo, replay, bench, devices, generate, eval, calibrate, plot, up, status or version; see 'questctl help')\n", args[0])
		return exitUsage
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	// One line: "questctl replay: ...", without repeating a command name
	// the message already starts with ("questctl bench attention: ...").
	msg, name := err.Error(), args[0]
	if (name == "bench" || name == "replay" || name == "eval") && len(args) > 1 && !strings.HasPrefix(args[1], "-") {
		name += " " + args[1] // "bench attention", "replay gen"
	}
	prefix := "questctl " + name + ": "
	if strings.HasPrefix(msg, name+":") || strings.HasPrefix(msg, args[0]+" ") {
		prefix = "questctl "
	}
	fmt.Fprintf(stderr, "%s%s\n", prefix, strings.ReplaceAll(msg, "\n", " "))
	if errors.As(err, new(usageError)) || errors.Is(err, memlimit.ErrTooLarge) {
		return exitUsage
	}
	return exitFailure
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
		return usageError{fmt.Errorf("%s (see 'questctl %s --help')", flagError(fs, err), fs.Name())}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q (see 'questctl %s --help')", fs.Args(), fs.Name())}
	}
	// An explicit empty value never means "the default": --selection ''
	// is a mistake, not a choice.
	var empty []string
	fs.Visit(func(f *flag.Flag) {
		if fmt.Sprintf("%T", f.Value) == "*flag.stringValue" && f.Value.String() == "" {
			empty = append(empty, "--"+f.Name)
		}
	})
	if len(empty) > 0 {
		return usageError{fmt.Errorf("%s: empty value (leave the flag out for its default; see 'questctl %s --help')", strings.Join(empty, ", "), fs.Name())}
	}
	return nil
}

// flagErrorRE matches the flag package's "invalid value" errors.
var flagErrorRE = regexp.MustCompile(`^invalid value "(.*)" for flag -([^:]+): (.*)$`)

// flagError rewrites the flag package's parse errors in the CLI's form,
// "--flag VALUE: what is wrong".
func flagError(fs *flag.FlagSet, err error) string {
	m := flagErrorRE.FindStringSubmatch(err.Error())
	if m == nil {
		return strings.Replace(err.Error(), "flag provided but not defined: -", "unknown flag --", 1)
	}
	why := m[3]
	kind := "a number"
	if f := fs.Lookup(m[2]); f != nil {
		switch fmt.Sprintf("%T", f.Value) {
		case "*flag.intValue", "*flag.int64Value":
			kind = "an integer"
		case "*flag.uintValue", "*flag.uint64Value":
			kind = "a non-negative integer"
		case "*flag.boolValue":
			kind = "true or false"
		case "*flag.durationValue":
			kind = "a duration such as 2s"
		}
	}
	switch {
	case strings.HasSuffix(why, "parse error"), strings.HasSuffix(why, "invalid syntax"):
		why = "not " + kind
	case strings.HasSuffix(why, "value out of range"):
		why = "too large for " + kind
	}
	return fmt.Sprintf("--%s %q: %s", m[2], m[1], why)
}

// maxMemoryFlag adds --max-memory to fs: the bytes a command may allocate
// for its data, checked from the configuration's geometry before anything
// is allocated.
func maxMemoryFlag(fs *flag.FlagSet) *int64 {
	limit := memlimit.Auto
	fs.Func("max-memory", "most memory the command may allocate, e.g. 4GiB or 512MiB (0: the memory available now, also the cap of a larger value; -1: no check at all); larger configurations are refused before allocating", func(s string) error {
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
