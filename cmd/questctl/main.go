// Command questctl is the questrt command-line tool: it runs the demo,
// replays saved requests and runs benchmarks. It holds no business logic:
// each subcommand parses flags and calls a package.
//
//	questctl demo     [flags]   synthetic long-context decode, Quest vs dense
//	questctl replay   --in case.json [--selector ...] [--out result.json]
//	questctl replay   gen [flags]   write a generated replay case
//	questctl bench    attention|collective|decode|offload|selection|serve [flags]
//	questctl devices  [--json]
//	questctl generate --model DIR --prompt TEXT [flags]
//	questctl eval     passkey --model DIR [flags]
//	questctl calibrate --model DIR --prompts FILE|--lengths L [--out policy.yaml]
//	questctl plot     --in FILE.jsonl[,...] --out FILE.png [--kind passkey|attention|auto]
//	questctl up       --nodes N [--cp C --tp T] [--model DIR] [-- questd flags]
//	questctl status   --addr HOST:PORT [--json]
//	questctl tls      ca|node|client [NAME] --dir DIR [flags]
//	questctl replay-request --addr HOST:PORT [--json] ID
//	questctl version
//	questctl completion bash|zsh|fish
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
	"github.com/questrt/questrt/plan"
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
  questctl bench  decode [flags]        whole-model decode tokens/s (and TTFT) on GPU 0, Quest vs dense, JSON lines (a -tags cuda build)
  questctl bench  offload [flags]       offload with a device page budget: step time vs all resident, hit rate, bytes moved, JSON lines
  questctl bench  selection [flags]     exact vs union vs replicated CP selection on the same data, JSON lines
  questctl bench serve --addr HOST:PORT [...]        load test of a completions API: TTFT, inter-token latency, tokens/s, passkey accuracy, JSON lines
  questctl devices [--json]             the node's NVIDIA GPUs (NVML): name, UUID, memory, PCI, NVLink, topology
  questctl generate --model DIR --prompt TEXT [...]  decode a Llama checkpoint through the engine (Quest or dense): text, pages read vs total, tokens/s
  questctl eval passkey --model DIR [...]            passkey accuracy, recall and attention-mass recall per layer vs dense, JSON lines
  questctl calibrate --model DIR --prompts F|--lengths L [...]  per-layer budgets reaching a target attention-mass recall; writes a --policy file
  questctl plot --in FILE.jsonl --out FILE.png       PNG figure of eval passkey or bench attention JSON lines
  questctl up --nodes N [--cp C --tp T] [--model DIR] [-- questd flags]  start a local questd cluster on loopback (--model: the completions API on node 0) until Ctrl-C
  questctl status --addr HOST:PORT [--json]          one questd's view: members and their state, devices, grid config
  questctl tls ca|node|client [NAME] --dir DIR       a cluster's CA, node and client certificates for mutual TLS (roles as URI SANs)
  questctl replay-request --addr HOST:PORT ID        re-run a served request with dense attention: per token, does dense agree, where they first diverge
  questctl version                                   the version and VCS revision of this build
  questctl completion bash|zsh|fish                  shell completion script: commands, subcommands and their flags

Run 'questctl <command> --help' for the flags of a command. Commands that
store a KV cache on the GPU take --kv-cache-dtype (default bf16; --dtype is
its deprecated older name); --tp and --cp are also --tensor-parallel-size
and --decode-context-parallel-size, as in vLLM.
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
	case "tls":
		err = runTLS(args[1:], stdout, stderr)
	case "replay-request":
		err = runReplayRequest(ctx, args[1:], stdout, stderr)
	case "version":
		err = runVersion(args[1:], stdout, stderr)
	case "completion":
		err = runCompletion(args[1:], stdout, stderr)
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "questctl: unknown command %q (want demo, replay, bench, devices, generate, eval, calibrate, plot, up, status, tls, replay-request, version or completion; see 'questctl help')\n", args[0])
		return exitUsage
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	// One line: "questctl replay: ...", without repeating a command name
	// the message already starts with ("questctl bench attention: ...").
	msg, name := err.Error(), args[0]
	if (name == "bench" || name == "replay" || name == "eval" || name == "completion" || name == "tls") && len(args) > 1 && !strings.HasPrefix(args[1], "-") {
		name += " " + args[1] // "bench attention", "replay gen", "completion zsh"
	}
	prefix := "questctl " + name + ": "
	if strings.HasPrefix(msg, name+":") || strings.HasPrefix(msg, args[0]+" ") {
		prefix = "questctl "
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) && !strings.Contains(msg, "interrupted") {
		// Ctrl-C (SIGINT): said first, not only as the context's error
		// at the end of whatever the command was doing.
		msg = "interrupted: " + msg
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

// action runs a command once its flags are parsed.
type action func(ctx context.Context, stdout, stderr io.Writer) error

// runCommand builds a command's flag set and action (build), parses args
// into the flags (see [parse]), warns on stderr about each deprecated
// flag name given (see [aliasFlag]) and runs the action.
func runCommand(ctx context.Context, build func() (*flag.FlagSet, action), args []string, stdout, stderr io.Writer) error {
	fs, act := build()
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	fs.Visit(func(f *flag.Flag) {
		if a, ok := f.Value.(*aliasValue); ok && a.deprecated {
			fmt.Fprintf(stderr, "questctl %s: --%s is deprecated: use --%s (the same values)\n", fs.Name(), f.Name, a.canonical)
		}
	})
	return act(ctx, stdout, stderr)
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
		if fmt.Sprintf("%T", valueOf(f)) == "*flag.stringValue" && f.Value.String() == "" {
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
		switch fmt.Sprintf("%T", valueOf(f)) {
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
	fs.Func("max-memory", "most memory the command may allocate, e.g. 4GiB or 512MiB (0: the memory available now, also the cap of a larger value; -1: no check, but for sizes beyond RAM plus swap or ulimit -v, which no allocation could get); larger configurations are refused before allocating", func(s string) error {
		v, err := memlimit.ParseBytes(s)
		if err != nil {
			return err
		}
		limit = v
		return nil
	})
	return &limit
}

// flagSet reports whether the flag name, or one of its aliases (see
// [aliasFlag]), was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	return givenAs(fs, name) != ""
}

// givenAs returns the name under which the flag name was last given on
// the command line, with its dashes ("--dtype" for --kv-cache-dtype given
// by its older name), or "" when it was not given.
func givenAs(fs *flag.FlagSet, name string) string {
	given := ""
	fs.Visit(func(f *flag.Flag) {
		if a, ok := f.Value.(*aliasValue); f.Name == name || ok && a.canonical == name {
			given = "--" + f.Name
		}
	})
	return given
}

// aliasValue is the Value of a flag registered under a second name: the
// Value of the flag it is an alias of, so both names set the same
// variable and the last one given wins, as for a flag given twice.
type aliasValue struct {
	flag.Value
	canonical  string // the flag's own name
	deprecated bool   // runCommand warns when this name is used
}

func (a *aliasValue) String() string {
	if a == nil || a.Value == nil {
		return ""
	}
	return a.Value.String()
}

func (a *aliasValue) IsBoolFlag() bool {
	b, ok := a.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// aliasFlag registers name as another name of fs's flag canonical, which
// must be defined. A deprecated alias works the same and makes the
// command print a one-line warning on stderr.
func aliasFlag(fs *flag.FlagSet, name, canonical string, deprecated bool) {
	f := fs.Lookup(canonical)
	if f == nil {
		panic("questctl: alias --" + name + " of an undefined flag --" + canonical)
	}
	usage := "the same as --" + canonical
	switch {
	case deprecated:
		usage = "deprecated: the older name of --" + canonical + ", the same values (warns on stderr)"
	case name == "tensor-parallel-size" || name == "decode-context-parallel-size":
		usage += " (vLLM's name)"
	}
	fs.Var(&aliasValue{Value: f.Value, canonical: canonical, deprecated: deprecated}, name, usage)
	fs.Lookup(name).DefValue = "" // help gives the default once, at canonical
}

// valueOf is f's Value, that of the flag it is an alias of for an alias.
func valueOf(f *flag.Flag) flag.Value {
	if a, ok := f.Value.(*aliasValue); ok {
		return a.Value
	}
	return f.Value
}

// gridFlags adds --cp and --tp to fs with *cp and *tp as their targets
// and defaults, and their vLLM names as aliases:
// --decode-context-parallel-size and --tensor-parallel-size.
func gridFlags(fs *flag.FlagSet, cp, tp *int, cpUsage, tpUsage string) {
	fs.IntVar(cp, "cp", *cp, cpUsage)
	fs.IntVar(tp, "tp", *tp, tpUsage)
	aliasFlag(fs, "decode-context-parallel-size", "cp", false)
	aliasFlag(fs, "tensor-parallel-size", "tp", false)
}

// defaultKVCacheDType is the one default of --kv-cache-dtype, in every
// command that has it: bf16, the type the CUDA kernels are measured at.
const defaultKVCacheDType = "bf16"

// dtypeValue is a storage type flag: f32, f16 or bf16 (or the long names
// plan.ParseDType reads), and fp8 where fp8 is set, checked when parsed.
type dtypeValue struct {
	s   string
	fp8 bool // fp8 (plan.FP8) is accepted
}

func (v *dtypeValue) String() string {
	if v == nil {
		return ""
	}
	return v.s
}

func (v *dtypeValue) Set(s string) error {
	// fp8 K/V (plan.FP8) is decoded by the CUDA backend, but only
	// bench decode takes it (kvCacheDTypeFlagFP8): the other commands
	// with this flag benchmark kernels that fill pages themselves,
	// offload slots or prefill on the GPU, none of which read fp8 pages.
	d, err := plan.ParseDType(s)
	if err != nil || (d == plan.FP8 && !v.fp8) {
		if v.fp8 {
			return errors.New("want f32, f16, bf16 or fp8")
		}
		return errors.New("want f32, f16 or bf16 (fp8: bench decode only)")
	}
	v.s = s
	return nil
}

// Choices are the values shell completion offers.
func (v *dtypeValue) Choices() []string {
	if v.fp8 {
		return []string{"f32", "f16", "bf16", "fp8"}
	}
	return []string{"f32", "f16", "bf16"}
}

// kvCacheDTypeFlag adds --kv-cache-dtype to fs, the storage type of the
// KV cache (K, V and page summaries) on the CUDA backend, default
// [defaultKVCacheDType], and --dtype, its deprecated older name. more is
// appended to the usage: what the command does with it.
func kvCacheDTypeFlag(fs *flag.FlagSet, more string) *string {
	v := &dtypeValue{s: defaultKVCacheDType}
	fs.Var(v, "kv-cache-dtype", "`type` of the KV cache on --backend cuda: f32, f16 or bf16 (K, V and page summaries; scores and accumulation are fp32; the CPU backend stores f32)"+more)
	aliasFlag(fs, "dtype", "kv-cache-dtype", true)
	return &v.s
}

// kvCacheDTypeFlagFP8 is kvCacheDTypeFlag that also takes fp8: K and V
// as E4M3 records with a float32 scale per (page, KV head), summaries
// float32 (the CUDA backend quantizes on append and dequantizes in the
// attention kernel).
func kvCacheDTypeFlagFP8(fs *flag.FlagSet, more string) *string {
	v := &dtypeValue{s: defaultKVCacheDType, fp8: true}
	fs.Var(v, "kv-cache-dtype", "`type` of the KV cache on --backend cuda: f32, f16, bf16 or fp8 (K, V and page summaries; fp8: e4m3 K/V with a float32 scale per page and KV head, float32 summaries; scores and accumulation are fp32)"+more)
	aliasFlag(fs, "dtype", "kv-cache-dtype", true)
	return &v.s
}
