//go:build !linux

package disktier

import "os"

// datasync flushes f to disk (fsync: no fdatasync here).
func datasync(f *os.File) error { return f.Sync() }

// reserve makes f at least size bytes long (no block reservation here).
func reserve(f *os.File, size int64, _ bool) error { return f.Truncate(size) }
