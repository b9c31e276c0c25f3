package disktier_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/questrt/questrt/pagestore/disktier"
)

// testConfig is a small tier in dir: slab files of 3 slots, so tests
// cross files.
func testConfig(dir string, slots, size int) disktier.Config {
	c := disktier.DefaultConfig()
	c.Dir = dir
	c.Slots = slots
	c.PayloadBytes = size
	c.SlotsPerFile = 3
	return c
}

func mustOpen(t testing.TB, c disktier.Config) *disktier.Tier {
	t.Helper()
	tr, err := disktier.Open(c)
	if err != nil {
		t.Fatalf("Open(%s): %v", c.Dir, err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// copyDir copies the regular files of src into a new directory (a crash
// image of a tier that is open: what a crash would leave on the disk if
// everything in the page cache had reached it).
func copyDir(t testing.TB, src string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		in.Close()
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}
