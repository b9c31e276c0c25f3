// Package readlimit reads user files with a bound: a file larger than its
// limit is refused before it is read (a regular file's size is checked
// first), and a read stops one byte past the limit (a pipe, or a file
// that grows meanwhile), so that a mistaken or hostile path never makes a
// command read gigabytes into memory before it says no.
package readlimit

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/questrt/questrt/internal/memlimit"
)

// ErrTooLarge means a file holds more bytes than its limit. Callers test
// for it with errors.Is; the message says the size and the limit.
var ErrTooLarge = errors.New("file too large")

// Open opens the file at path for reading and refuses it, without
// reading any of it, when it is a regular file larger than max bytes.
// Callers that read it through [Reader] are bounded also for pipes and
// for a file that grows after Open.
func Open(path string, max int64) (*os.File, error) {
	if max < 0 {
		return nil, fmt.Errorf("readlimit: limit %d: want 0 or more bytes", max)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if fi.Mode().IsRegular() && fi.Size() > max {
		f.Close()
		return nil, tooLarge(path, fi.Size(), max)
	}
	return f, nil
}

// Reader returns a reader of r that fails with an error wrapping
// [ErrTooLarge] (naming name) once r gives more than max bytes, having
// read at most max+1.
func Reader(r io.Reader, name string, max int64) io.Reader {
	return &reader{r: io.LimitReader(r, max+1), name: name, max: max}
}

type reader struct {
	r    io.Reader
	name string
	max  int64
	n    int64
}

func (l *reader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	l.n += int64(n)
	if l.n > l.max {
		return n - int(l.n-l.max), tooLarge(l.name, -1, l.max)
	}
	return n, err
}

// ReadFile reads the file at path, refusing one of more than max bytes
// with an error wrapping [ErrTooLarge]: a regular file's size is checked
// before reading, any other file is read up to max+1 bytes.
func ReadFile(path string, max int64) ([]byte, error) {
	f, err := Open(path, max)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(Reader(f, path, max))
}

// SizeError is the error of a file over its limit, inside an
// *os.PathError naming the file; errors.Is(err, ErrTooLarge) holds.
type SizeError struct {
	Size int64 // the file's size, or -1 for a stream read past Max
	Max  int64 // the limit
}

func (e *SizeError) Error() string {
	if e.Size < 0 {
		return fmt.Sprintf("more than the %s limit of this file", limitText(e.Max))
	}
	return fmt.Sprintf("%s, more than the %s limit of this file", memlimit.Bytes(e.Size), limitText(e.Max))
}

// Is reports whether target is [ErrTooLarge].
func (e *SizeError) Is(target error) bool { return target == ErrTooLarge }

// tooLarge is the error of a file over its limit (size -1: more than the
// limit, read so far).
func tooLarge(name string, size, max int64) error {
	return &os.PathError{Op: "read", Path: name, Err: &SizeError{Size: size, Max: max}}
}

func limitText(max int64) string {
	if max < 1024 {
		return memlimit.Bytes(max)
	}
	return fmt.Sprintf("%s (%d bytes)", memlimit.Bytes(max), max)
}

// MaxPEMFile bounds each file of [LoadX509KeyPair].
const MaxPEMFile = 1 << 20

// LoadX509KeyPair is tls.LoadX509KeyPair with each file read through
// [ReadFile] under [MaxPEMFile]: a path to a large file is refused from
// its size instead of read into memory.
func LoadX509KeyPair(certFile, keyFile string) (tls.Certificate, error) {
	cert, err := ReadFile(certFile, MaxPEMFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := ReadFile(keyFile, MaxPEMFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(cert, key)
}
