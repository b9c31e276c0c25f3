package main

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"

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
	// no connections.
	TLS bool `json:"tls"`
}

// collectiveLine is one JSON line of bench collective: a configuration of
// the selection exchange and the merge, with their baselines.
type collectiveLine struct {
	Kind string `json:"kind"` // "collective"
	collective.BenchResult
	benchMeta
}

// sweepLine is one JSON line of an all-gather sweep.
type sweepLine struct {
	Kind string `json:"kind"` // "allgather_sweep"
	collective.SweepResult
	benchMeta
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
		TLS: false,
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
