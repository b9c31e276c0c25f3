//go:build linux

package disktier

import (
	"os"

	"golang.org/x/sys/unix"
)

// datasync flushes f's data (and the metadata needed to read it) to disk.
func datasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = unix.Fdatasync(int(fd))
			if serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}

// reserve makes f at least size bytes long, with its blocks allocated when
// alloc is set.
func reserve(f *os.File, size int64, alloc bool) error {
	if !alloc {
		return f.Truncate(size)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = unix.Fallocate(int(fd), 0, 0, size)
			if serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr == unix.EOPNOTSUPP {
		return f.Truncate(size)
	}
	if serr != nil {
		return &os.PathError{Op: "fallocate", Path: f.Name(), Err: serr}
	}
	return nil
}
