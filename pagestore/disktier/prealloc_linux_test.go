package disktier_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/questrt/questrt/pagestore/tier/tiertest"
)

// TestSlabFileSizes: a slab file is created at the size of its slots (the
// last file holds the remainder), sparse by default and with its blocks
// reserved under Preallocate.
func TestSlabFileSizes(t *testing.T) {
	for _, pre := range []bool{false, true} {
		c := testConfig(t.TempDir(), 5, 10000) // files of 3 and 2 slots of 12 KiB
		c.Preallocate = pre
		tr := mustOpen(t, c)
		ctx := ctxT(t)
		for _, s := range []int{0, 4} {
			if err := tr.Write(ctx, s, tiertest.Payload(s, 0, c.PayloadBytes)); err != nil {
				t.Fatal(err)
			}
		}
		for fi, slots := range []int{3, 2} {
			st, err := os.Stat(filepath.Join(c.Dir, []string{"slab-000000", "slab-000001"}[fi]))
			if err != nil {
				t.Fatal(err)
			}
			want := int64(slots) * c.SlotBytes()
			if st.Size() != want {
				t.Errorf("preallocate %v: file %d is %d bytes, want %d", pre, fi, st.Size(), want)
			}
			blocks := st.Sys().(*syscall.Stat_t).Blocks * 512
			if pre && blocks < want {
				t.Errorf("preallocate: file %d has %d bytes of blocks, want >= %d", fi, blocks, want)
			}
			if !pre && blocks >= want {
				t.Logf("file %d is not sparse (%d bytes of blocks): the file system may not support holes", fi, blocks)
			}
		}
	}
}
