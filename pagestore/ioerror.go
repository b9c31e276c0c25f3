package pagestore

import (
	"errors"
	"io/fs"
	"regexp"
	"strings"
	"syscall"
)

// Sentinel errors of a persisting store's I/O ([Config.DataDir]). Errors
// that wrap them are *IOError and wrap [ErrPersist] too: what took effect
// is as [ErrPersist] says (the operation did, in memory; it is not
// durable).
var (
	// ErrDiskFull: a write to the data directory failed for lack of
	// space: the file system is full (ENOSPC) or the user's quota is
	// used up (EDQUOT). Freeing space lets the next operation that
	// persists succeed, and it persists what the failed ones did not.
	ErrDiskFull = errors.New("pagestore: disk full")
	// ErrIO: an operation on a file of the data directory failed with
	// another operating system error (EIO, EROFS, EACCES, ...).
	ErrIO = errors.New("pagestore: data directory I/O error")
)

// IOError is a failed operation on a file of a persisting store's data
// directory (or of a worker's sequence table next to it). Its message
// names the operation and the condition ("disk full (no space left on
// device)") but never a file, so that it may travel to clients; Path
// and Err, the operating system's error, are for the node's log.
//
// It wraps [ErrPersist], [ErrDiskFull] or [ErrIO] as the condition says
// (neither for an error that carries no operating system error number:
// a closed file, say), and Err.
type IOError struct {
	// Op says what failed ("write page", "commit metadata", ...).
	Op string
	// Path is the file (or directory) the operation was on.
	Path string
	// Err is the operation's error; its message may name Path.
	Err error
	// Closing is set for the failures of a Close, which saves every
	// sequence in full: the store's sequences (those it could not
	// save) come back at a restart at their last committed lengths,
	// their tail tokens reported lost.
	Closing bool
}

// Error returns "pagestore: persist: OP: CONDITION", without paths.
func (e *IOError) Error() string {
	return "pagestore: persist: " + e.Op + ": " + Condition(e.Err)
}

// Unwrap returns ErrPersist, ErrDiskFull or ErrIO when the condition is
// one of theirs, and Err.
func (e *IOError) Unwrap() []error {
	errs := []error{ErrPersist}
	if k := ioKind(e.Err); k != nil {
		errs = append(errs, k)
	}
	return append(errs, e.Err)
}

// IOKind classifies an error of a data directory's file: ErrDiskFull for
// ENOSPC and EDQUOT, ErrIO for another operating system error, nil for
// an error without an error number (and for nil).
func IOKind(err error) error {
	if err == nil {
		return nil
	}
	return ioKind(err)
}

func ioKind(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if errno == syscall.ENOSPC || errno == syscall.EDQUOT {
			return ErrDiskFull
		}
		return ErrIO
	}
	// bbolt formats some operating system errors with %s (the growth
	// of its file: "file resize error: no space left on device").
	s := err.Error()
	if strings.Contains(s, syscall.ENOSPC.Error()) || strings.Contains(s, syscall.EDQUOT.Error()) {
		return ErrDiskFull
	}
	return nil
}

// Condition names the condition err met, without naming a file: "disk
// full (no space left on device)", "disk quota exceeded", the operating
// system's text of another error number ("input/output error",
// "read-only file system"), else err's message with every absolute path
// in it replaced by "<path>".
func Condition(err error) string {
	if err == nil {
		return "no error"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if errno == syscall.ENOSPC || errno == syscall.EDQUOT {
			return "disk full (" + errno.Error() + ")"
		}
		return errno.Error()
	}
	if ioKind(err) == ErrDiskFull {
		return "disk full (" + scrubPaths(err.Error()) + ")"
	}
	return scrubPaths(err.Error())
}

// absPathRE matches an absolute path at the start of a message or after
// a space, parenthesis or quote, up to a separator that rarely occurs in
// a path.
var absPathRE = regexp.MustCompile(`(^|[\s("'])/[^\s:;,"'()]*`)

// scrubPaths replaces the absolute paths in s by "<path>".
func scrubPaths(s string) string {
	return absPathRE.ReplaceAllString(s, "$1<path>")
}

// errPath is the file err names (an *fs.PathError's), else path.
func errPath(err error, path string) string {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path != "" {
		return pe.Path
	}
	return path
}

// newIOError makes the *IOError of op on path failing with err and
// reports it to on (nil: nobody); an err that is an *IOError already is
// returned as it is (it was reported).
func newIOError(on func(*IOError), op, path string, err error, closing bool) error {
	var ie *IOError
	if errors.As(err, &ie) {
		return err
	}
	e := &IOError{Op: op, Path: errPath(err, path), Err: err, Closing: closing}
	if on != nil {
		on(e)
	}
	return e
}
