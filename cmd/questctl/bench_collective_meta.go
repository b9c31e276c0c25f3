package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/bench/clusterrun"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/buildinfo"
)

// hostMeta describes the machine a benchmark line was measured on.
type hostMeta struct {
	CPU   string `json:"cpu"`   // /proc/cpuinfo's model name, "unknown" elsewhere
	Cores int    `json:"cores"` // logical CPUs (runtime.NumCPU)
	// LoadAvg is the 1, 5 and 15 minute load averages (/proc/loadavg) as
	// the line was written; nil where unknown.
	LoadAvg []float64 `json:"load_avg"`
	Kernel  string    `json:"kernel"` // OS and release: "linux 6.8.0-..."
}

// benchMeta is what every line of bench collective carries besides its
// figures: the host, the build and the security of the transport, so
// that lines from different runs compare knowingly.
type benchMeta struct {
	Host      hostMeta `json:"host"`
	GoVersion string   `json:"go_version"`
	// Version and Commit are the questrt module version and the VCS
	// revision the binary was built from (runtime/debug's vcs settings;
	// "(devel)" and "unknown" when absent); Modified: the work tree had
	// uncommitted changes.
	Version  string `json:"questrt_version"`
	Commit   string `json:"commit"`
	Modified bool   `json:"commit_modified"`
	// TLS reports whether the transport's connections were encrypted:
	// bench collective runs gRPC in plaintext on 127.0.0.1, and inproc has
	// no connections; with --addr it is the cluster's collective streams'
	// (every rank's encrypted).
	TLS bool `json:"tls"`
}

// collectiveLine is one JSON line of bench collective: a configuration of
// the selection exchange and the merge, with their baselines.
type collectiveLine struct {
	Kind string `json:"kind"` // "collective"
	collective.BenchResult
	benchMeta
	*clusterrun.Cluster // --addr only
}

// sweepLine is one JSON line of an all-gather sweep.
type sweepLine struct {
	Kind string `json:"kind"` // "allgather_sweep"
	collective.SweepResult
	benchMeta
	*clusterrun.Cluster // --addr only
}

// Kinds of bench collective lines.
const (
	kindCollective = "collective"
	kindSweep      = "allgather_sweep"
)

// readBenchMeta reads the metadata of a line written now. The CPU model
// and the kernel are read once per run (cpu, kernel), the load average
// each time.
func readBenchMeta(cpu, kernel string) benchMeta {
	bi := buildinfo.Read()
	return benchMeta{
		Host:      hostMeta{CPU: cpu, Cores: runtime.NumCPU(), LoadAvg: loadAvg(), Kernel: kernel},
		GoVersion: runtime.Version(),
		Version:   bi.Version, Commit: bi.Revision, Modified: bi.Modified,
	}
}

// cpuModel is the first "model name" of /proc/cpuinfo, or "unknown".
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// kernelRelease is the OS and, on Linux, the kernel release.
func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return runtime.GOOS
	}
	return runtime.GOOS + " " + strings.TrimSpace(string(b))
}

// loadAvg is /proc/loadavg's three load averages, nil where unknown.
func loadAvg() []float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return nil
	}
	out := make([]float64, 3)
	for i := range out {
		if out[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return nil
		}
	}
	return out
}

// lineWriter writes the lines of bench collective: JSON on stdout, and
// a table on stderr unless quiet.
type lineWriter struct {
	stdout, stderr io.Writer
	quiet          bool
	cpu, kernel    string // read once per run
	header         bool   // the sweep table's header is written
}

func newLineWriter(stdout, stderr io.Writer, quiet bool) *lineWriter {
	return &lineWriter{stdout: stdout, stderr: stderr, quiet: quiet, cpu: cpuModel(), kernel: kernelRelease()}
}

// meta is the metadata of a line written now, its transport's
// connections encrypted or not (tls).
func (w *lineWriter) meta(tls bool) benchMeta {
	m := readBenchMeta(w.cpu, w.kernel)
	m.TLS = tls
	return m
}

// collective writes the line of one configuration of the selection and
// merge (cm: its cluster, with --addr).
func (w *lineWriter) collective(r collective.BenchResult, tls bool, cm *clusterrun.Cluster) error {
	if err := bench.WriteJSONLine(w.stdout, collectiveLine{Kind: kindCollective, BenchResult: r, benchMeta: w.meta(tls), Cluster: cm}); err != nil {
		return err
	}
	if w.quiet {
		return nil
	}
	how := ""
	if r.Processes > 1 {
		how = fmt.Sprintf(" (%d processes)", r.Processes)
	}
	if cm != nil {
		how = fmt.Sprintf(" (nodes %s)", strings.Join(cm.Nodes, ", "))
	}
	fmt.Fprintf(w.stderr, "%-6s shards %2d batch %2d: select p50 %.1f p99 %.1f us (baseline %.1f / %.1f, %.2fx), merge p50 %.1f p99 %.1f us (baseline %.1f / %.1f, %.2fx), ping-pong p50 %.1f us, %d + %d bytes/step%s\n",
		r.Transport, r.Shards, r.Batch, r.SelectP50, r.SelectP99, r.BaselineP50, r.BaselineP99, r.OverheadVsBaseline,
		r.MergeP50, r.MergeP99, r.MergeBaselineP50, r.MergeBaselineP99, r.MergeOverheadVsBaseline, r.PingPongP50,
		r.SelectBytes, r.MergeBytes, how)
	return nil
}

// sweep writes the line of one size of a sweep.
func (w *lineWriter) sweep(r collective.SweepResult, tls bool, cm *clusterrun.Cluster) error {
	if err := bench.WriteJSONLine(w.stdout, sweepLine{Kind: kindSweep, SweepResult: r, benchMeta: w.meta(tls), Cluster: cm}); err != nil {
		return err
	}
	if w.quiet {
		return nil
	}
	if !w.header {
		fmt.Fprintf(w.stderr, "%-7s %6s %5s %12s %10s %10s %10s %10s %10s\n",
			"#", "shards", "procs", "size (B)", "time (us)", "p50 (us)", "p99 (us)", "algbw GB/s", "busbw GB/s")
		w.header = true
	}
	fmt.Fprintf(w.stderr, "%-7s %6d %5d %12d %10.1f %10.1f %10.1f %10.3f %10.3f\n",
		r.Transport, r.Shards, r.Processes, r.Bytes, r.TimeUS, r.P50, r.P99, r.AlgBW, r.BusBW)
	return nil
}
