package metastore_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/plan"
)

// TestBoltMmapFallback: under an address space limit (ulimit -v, here
// RLIMIT_AS 256 MiB above what the process maps) that a 4 GiB map does
// not fit, OpenBoltManifests with MmapBytes 4 GiB opens anyway (mapping
// less), and what is committed through it loads back after a reopen.
// Run in a child process: the limit is the process's.
func TestBoltMmapFallback(t *testing.T) {
	if os.Getenv("METASTORE_MMAP_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestBoltMmapFallback$", "-test.v")
		cmd.Env = append(os.Environ(), "METASTORE_MMAP_CHILD="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestBoltMmapFallback") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	dir := os.Getenv("METASTORE_MMAP_CHILD")
	vm := vmSize(t)
	lim := syscall.Rlimit{Cur: uint64(vm + 256<<20), Max: uint64(vm + 256<<20)}
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &lim); err != nil {
		t.Skipf("setrlimit: %v", err)
	}
	const big = 4 << 30
	if b, err := syscall.Mmap(-1, 0, big, syscall.PROT_READ, syscall.MAP_PRIVATE|syscall.MAP_ANON); err == nil {
		syscall.Munmap(b)
		t.Fatal("a 4 GiB map fits under the limit: the test tests nothing")
	}
	path := filepath.Join(dir, "store.db")
	m, err := metastore.OpenBoltManifests(path, metastore.Options{MmapBytes: big})
	if err != nil {
		t.Fatalf("open with a 4 GiB map under a %d-byte address space limit: %v", lim.Cur, err)
	}
	f := metastore.ManifestFormat{Layers: 2, KVHeads: 4, HeadDim: 128, PageSize: 16, DType: plan.Float32}
	if err := m.Init(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(ctx, summaryBatch(64, 5)); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m, err = metastore.OpenBoltManifests(path, metastore.Options{MmapBytes: big})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Init(ctx, f); err != nil {
		t.Fatal(err)
	}
	ld, err := m.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ld.Summaries) != 64 || ld.Summaries[63][1] != byte((63*5+1)%256) {
		t.Fatalf("loaded %d summary records, want 64 as committed", len(ld.Summaries))
	}
}

// vmSize is the process's mapped address space (VmSize) in bytes.
func vmSize(t *testing.T) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmSize:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Skip("no VmSize in /proc/self/status")
	return 0
}
