package memwatch

import (
	"syscall"
	"testing"
)

// TestRSSGrows: RSS sees 256 MB of anonymous memory once touched, and
// no longer once unmapped (outside the Go heap, whose freed pages a
// repeated run would reuse).
func TestRSSGrows(t *testing.T) {
	before, err := RSS()
	if err != nil {
		t.Fatal(err)
	}
	const n = 256 << 20
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	touched, err := RSS()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Munmap(b); err != nil {
		t.Fatal(err)
	}
	after, err := RSS()
	if err != nil {
		t.Fatal(err)
	}
	if touched-before < 250<<20 || touched-after < 250<<20 {
		t.Errorf("RSS %d MB, %d MB with 256 MB touched, %d MB once unmapped", before>>20, touched>>20, after>>20)
	}
}
