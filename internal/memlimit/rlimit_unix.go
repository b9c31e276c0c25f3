//go:build unix

package memlimit

import (
	"math"
	"syscall"
)

// addressLimit returns the soft address-space limit (RLIMIT_AS, ulimit -v)
// when one is set (RLIM_INFINITY, all ones, is none).
func addressLimit() (int64, bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &r); err != nil || r.Cur >= math.MaxInt64 {
		return 0, false
	}
	return int64(r.Cur), true
}
