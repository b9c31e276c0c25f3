package readlimit

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadFile: a file at the limit is read whole; one byte more is
// refused naming the path, its size and the limit.
func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, bytes.Repeat([]byte("x"), 100), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := ReadFile(p, 100)
	if err != nil || len(b) != 100 {
		t.Fatalf("at the limit: %d bytes, %v", len(b), err)
	}
	_, err = ReadFile(p, 99)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "100 B") || !strings.Contains(err.Error(), "99 B limit") {
		t.Fatalf("past the limit: %v", err)
	}
	var se *SizeError
	if !errors.As(err, &se) || se.Size != 100 || se.Max != 99 || errors.Unwrap(err) != error(se) {
		t.Fatalf("past the limit: %#v, want a *SizeError{100, 99} inside an *os.PathError", err)
	}
	if _, err := ReadFile(filepath.Join(dir, "none"), 10); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := ReadFile(p, -1); err == nil {
		t.Fatal("limit -1 accepted")
	}
}

// TestOpenRefusesBeforeReading: a sparse file of 1 TiB (no blocks on
// disk) is refused at once, from its size: nothing is read.
func TestOpenRefusesBeforeReading(t *testing.T) {
	p := filepath.Join(t.TempDir(), "huge")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil {
		t.Skipf("no sparse file here: %v", err)
	}
	f.Close()
	if _, err := Open(p, 1<<20); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "1.0 TiB") {
		t.Fatalf("1 TiB file: %v", err)
	}
}

// TestReader: a stream (a pipe has no size) is cut one byte past the
// limit with ErrTooLarge, having handed over at most the limit.
func TestReader(t *testing.T) {
	counted := &countReader{r: strings.NewReader(strings.Repeat("y", 1000))}
	b, err := io.ReadAll(Reader(counted, "stdin", 10))
	if !errors.Is(err, ErrTooLarge) || len(b) != 10 || counted.n > 11 || !strings.Contains(err.Error(), "read stdin: more than the 10 B limit") {
		t.Fatalf("got %d bytes (read %d), %v", len(b), counted.n, err)
	}
	b, err = io.ReadAll(Reader(strings.NewReader("0123456789"), "stdin", 10))
	if err != nil || string(b) != "0123456789" {
		t.Fatalf("at the limit: %q, %v", b, err)
	}
}

type countReader struct {
	r io.Reader
	n int
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
