// Package memlimit sizes allocations before they happen. Constructors that
// allocate memory from a configuration's geometry (page pools, synthetic
// contexts, benchmark data) compute the bytes they need first and ask
// [Check] whether that fits a limit; a configuration that does not fit gets
// a one-line error that says how much it needs, instead of reaching a Go
// runtime out-of-memory crash.
//
// A limit is a byte count: positive values are used as given (a
// --max-memory flag, say), [Auto] (0) means the memory the machine can
// give now ([Available]), and [NoLimit] (-1) turns the check off for every
// size the process could ever hold ([Ceiling]): a size beyond the
// machine's memory is refused under any limit, since its allocation can
// only end in the runtime's crash.
package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"strconv"
	"strings"
)

// ErrTooLarge means a configuration needs more memory than its limit.
// Callers test for it with errors.Is; the message says how much was needed.
var ErrTooLarge = errors.New("does not fit in memory")

// Limit values with a meaning of their own.
const (
	// Auto resolves to the memory available on the machine (see [Available]).
	Auto int64 = 0
	// NoLimit turns the check off, but for sizes beyond [Ceiling].
	NoLimit int64 = -1
)

// Available returns the bytes this process can still allocate without
// swapping: the kernel's MemAvailable, capped by the memory cgroup's
// remaining room (cgroup v2 memory.max - memory.current, or v1
// memory.limit_in_bytes - memory.usage_in_bytes) when one is set, and by
// the room left under the address-space limit (RLIMIT_AS, ulimit -v) less
// what the process maps now, when one is set. It fails where
// /proc/meminfo cannot be read (not Linux).
func Available() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("memlimit: %w", err)
	}
	avail, err := parseMeminfo(b)
	if err != nil {
		return 0, err
	}
	if room, ok := cgroupRoom(); ok && room < avail {
		avail = room
	}
	if room, ok := addressRoom(); ok && room < avail {
		avail = room
	}
	return avail, nil
}

// Ceiling returns the most memory this process could ever hold, and what
// sets it: the machine's RAM plus swap (MemTotal + SwapTotal), capped by
// the memory cgroup's limit and by the room left under the address-space
// limit (RLIMIT_AS, ulimit -v). An allocation beyond it cannot succeed
// whatever else is freed: the Go runtime would end the process with "out
// of memory". [Check] refuses sizes beyond it under every limit,
// [NoLimit] included. It fails where /proc/meminfo cannot be read.
func Ceiling() (n int64, why string, err error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, "", fmt.Errorf("memlimit: %w", err)
	}
	n, err = parseTotal(b)
	if err != nil {
		return 0, "", err
	}
	why = "RAM plus swap"
	if limit, ok := cgroupLimit(); ok && limit < n {
		n, why = limit, "the memory cgroup's limit"
	}
	if room, ok := addressRoom(); ok && room < n {
		n, why = room, "the room under the address-space limit (ulimit -v)"
	}
	return n, why, nil
}

// parseTotal returns MemTotal + SwapTotal in bytes from /proc/meminfo's
// text (SwapTotal 0 when absent).
func parseTotal(b []byte) (int64, error) {
	var total, swap int64 = -1, 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || (f[0] != "MemTotal:" && f[0] != "SwapTotal:") {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || kb < 0 || kb > math.MaxInt64/4096 {
			return 0, fmt.Errorf("memlimit: bad %s %q", f[0], f[1])
		}
		if f[0] == "MemTotal:" {
			total = kb * 1024
		} else {
			swap = kb * 1024
		}
	}
	if total < 0 {
		return 0, errors.New("memlimit: /proc/meminfo has no MemTotal")
	}
	return total + swap, nil
}

// addressRoom returns the address-space limit (RLIMIT_AS) less the
// process's mapped size (VmSize), when a limit is set.
func addressRoom() (int64, bool) {
	limit, ok := addressLimit()
	if !ok {
		return 0, false
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	mapped, ok := parseVmSize(b)
	if !ok {
		return 0, false
	}
	return max(limit-mapped, 0), true
}

// parseVmSize returns VmSize in bytes from /proc/self/status's text.
func parseVmSize(b []byte) (int64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "VmSize:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb < 0 || kb > math.MaxInt64/1024 {
				return 0, false
			}
			return kb * 1024, true
		}
	}
	return 0, false
}

// ParseMemAvailable returns MemAvailable in bytes from the text of
// /proc/meminfo (what [Available] reads before the cgroup and
// address-space caps); tests of sizing arithmetic feed it fake text.
func ParseMemAvailable(meminfo []byte) (int64, error) { return parseMeminfo(meminfo) }

// parseMeminfo returns MemAvailable in bytes from /proc/meminfo's text.
func parseMeminfo(b []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb < 0 || kb > math.MaxInt64/1024 {
				return 0, fmt.Errorf("memlimit: bad MemAvailable %q", f[1])
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("memlimit: /proc/meminfo has no MemAvailable")
}

// cgroupRoom returns limit - usage of this process's memory cgroup, when a
// limit is set (v2 unified hierarchy first, then v1).
func cgroupRoom() (int64, bool) {
	for _, p := range cgroupFiles {
		limit, ok1 := readInt(p[0])
		usage, ok2 := readInt(p[1])
		// v1 reports "no limit" as a huge page-aligned number.
		if !ok1 || !ok2 || limit >= 1<<60 {
			continue
		}
		return max(limit-usage, 0), true
	}
	return 0, false
}

// cgroupLimit returns the limit of this process's memory cgroup, when one
// is set.
func cgroupLimit() (int64, bool) {
	for _, p := range cgroupFiles {
		if limit, ok := readInt(p[0]); ok && limit < 1<<60 {
			return limit, true
		}
	}
	return 0, false
}

// cgroupFiles are the limit and usage files of the memory cgroup, v2
// then v1.
var cgroupFiles = [][2]string{
	{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
	{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
}

func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil // "max" (v2, no limit) fails to parse: no limit
}

// Check returns nil when need bytes fit limit, and otherwise an error
// wrapping [ErrTooLarge] that names what needs them:
//
//	page pools need 6.2 GiB, more than the 3.1 GiB of memory available now (...)
//
// limit is a byte count, [Auto] or [NoLimit]. A positive limit can only
// lower the bound: a need over the memory available now is refused even
// when the limit is larger (a larger limit would only trade this error for
// the Go runtime's out-of-memory crash). Where the available memory cannot
// be read (no /proc), a positive limit is used as given and [Auto] refuses
// only sizes that overflow. A negative need (an overflowed computation) is
// always refused; [NoLimit] refuses only a need beyond [Ceiling], which no
// allocation could get.
func Check(what string, need, limit int64) error {
	if need < 0 {
		return fmt.Errorf("%s: size overflows int64: %w", what, ErrTooLarge)
	}
	switch {
	case limit == NoLimit:
		if ceil, why, err := Ceiling(); err == nil && need > ceil {
			p := bytesPair(need, ceil)
			return fmt.Errorf("%s need %s, more than this process could ever get even with no memory limit (%s, %s): %w", what, p[0], p[1], why, ErrTooLarge)
		}
		return nil
	case limit < 0:
		return fmt.Errorf("memory limit %d: want a byte count, 0 (available memory) or -1 (no limit)", limit)
	case limit > 0 && need > limit:
		return fmt.Errorf("%s need %s, more than the %s memory limit: %w", what, bytesPair(need, limit)[0], bytesPair(need, limit)[1], ErrTooLarge)
	}
	avail, err := Available()
	if err != nil {
		return nil
	}
	if need > avail {
		return fmt.Errorf("%s need %s, more than the %s of memory available now (free memory, or ask for less): %w",
			what, bytesPair(need, avail)[0], bytesPair(need, avail)[1], ErrTooLarge)
	}
	return nil
}

// bytesPair formats two sizes, with exact byte counts when their rounded
// forms would read the same ("2.2 GiB, more than the 2.2 GiB").
func bytesPair(a, b int64) [2]string {
	fa, fb := Bytes(a), Bytes(b)
	if fa == fb {
		fa, fb = fmt.Sprintf("%s (%d bytes)", fa, a), fmt.Sprintf("%s (%d bytes)", fb, b)
	}
	return [2]string{fa, fb}
}

// Mul multiplies non-negative factors and returns -1 when the product
// overflows int64 (or a factor is negative), which [Check] refuses.
func Mul(xs ...int64) int64 {
	p := uint64(1)
	for _, x := range xs {
		if x < 0 {
			return -1
		}
		hi, lo := bits.Mul64(p, uint64(x))
		if hi != 0 || lo > math.MaxInt64 {
			return -1
		}
		p = lo
	}
	return int64(p)
}

// Add sums sizes from [Mul]; any -1 term or an overflow gives -1.
func Add(xs ...int64) int64 {
	var s int64
	for _, x := range xs {
		if x < 0 || s > math.MaxInt64-x {
			return -1
		}
		s += x
	}
	return s
}

// Bytes formats n with a binary unit: "512 B", "3.2 KiB", "6.2 GiB".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB"} {
		v /= unit
		if v < unit || u == "PiB" {
			return fmt.Sprintf("%.1f %s", v, u)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// ParseBytes reads a size such as "4GiB", "512MiB", "2G", "1500000" or
// "0" (bytes when there is no unit; K, M, G, T with or without "iB" are
// binary). "-1" is [NoLimit]. It is the parser behind --max-memory flags.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "-1" {
		return NoLimit, nil
	}
	num := strings.TrimRight(t, "KMGTPiBkmgtpib")
	suffix := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(t[len(num):]), "B"), "I")
	shift := map[string]uint{"": 0, "K": 10, "M": 20, "G": 30, "T": 40, "P": 50}
	sh, ok := shift[suffix]
	v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if !ok || err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is not a size (want bytes like 4GiB, 512MiB or 1500000; 0: available memory; -1: no limit)", s)
	}
	b := v * float64(uint64(1)<<sh)
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is too large (want at most 8 EiB)", s)
	}
	if b < 1 && v != 0 {
		// "0.5" or "1e-9" would truncate to 0, which means "available
		// memory": refuse instead of guessing.
		return 0, fmt.Errorf("%q is less than one byte (0 means the available memory)", s)
	}
	return int64(b), nil
}
