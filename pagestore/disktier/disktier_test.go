package disktier_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/questrt/questrt/pagestore/disktier"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/pagestore/tier/tiertest"
)

func TestConformance(t *testing.T) {
	for _, d := range []disktier.Durability{disktier.SyncOnWrite, disktier.SyncPeriodic, disktier.SyncNone} {
		for _, align := range []int{4096, 1} {
			t.Run(fmt.Sprintf("%v/align%d", d, align), func(t *testing.T) {
				tiertest.Run(t, func(t *testing.T, slots, size int) tier.Tier {
					c := testConfig(t.TempDir(), slots, size)
					c.Durability = d
					c.SyncInterval = 5 * time.Millisecond
					c.SlotAlign = align
					tr, err := disktier.Open(c)
					if err != nil {
						t.Fatal(err)
					}
					return tr
				})
			})
		}
	}
}

func TestConformanceFaulty(t *testing.T) {
	tiertest.Run(t, func(t *testing.T, slots, size int) tier.Tier {
		tr, err := disktier.Open(testConfig(t.TempDir(), slots, size))
		if err != nil {
			t.Fatal(err)
		}
		return &tier.Faulty{Tier: tr}
	})
}

func TestConfig(t *testing.T) {
	if err := disktier.DefaultConfig().Validate(); !errors.Is(err, disktier.ErrInvalidConfig) {
		t.Errorf("DefaultConfig without Dir: %v, want ErrInvalidConfig", err)
	}
	good := disktier.DefaultConfig()
	good.Dir = t.TempDir()
	if err := good.Validate(); err != nil {
		t.Fatalf("DefaultConfig with Dir: %v", err)
	}
	if got := good.PayloadBytes; got != 2<<20 {
		t.Errorf("default PayloadBytes %d, want 2 MiB", got)
	}
	for name, mod := range map[string]func(*disktier.Config){
		"slots 0":          func(c *disktier.Config) { c.Slots = 0 },
		"slots huge":       func(c *disktier.Config) { c.Slots = 1 << 40 },
		"payload 0":        func(c *disktier.Config) { c.PayloadBytes = 0 },
		"payload huge":     func(c *disktier.Config) { c.PayloadBytes = 1 << 32 },
		"slots per file 0": func(c *disktier.Config) { c.SlotsPerFile = 0 },
		"align 3":          func(c *disktier.Config) { c.SlotAlign = 3 },
		"align 0":          func(c *disktier.Config) { c.SlotAlign = 0 },
		"align 2 MiB":      func(c *disktier.Config) { c.SlotAlign = 2 << 20 },
		"durability":       func(c *disktier.Config) { c.Durability = 7 },
		"interval":         func(c *disktier.Config) { c.Durability, c.SyncInterval = disktier.SyncPeriodic, 0 },
		"lock timeout":     func(c *disktier.Config) { c.LockTimeout = 0 },
	} {
		c := good
		mod(&c)
		err := c.Validate()
		if !errors.Is(err, disktier.ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig", name, err)
		}
		if _, oerr := disktier.Open(c); !errors.Is(oerr, disktier.ErrInvalidConfig) {
			t.Errorf("%s: Open = %v, want ErrInvalidConfig", name, oerr)
		}
	}
	// SyncInterval is unused outside SyncPeriodic.
	c := good
	c.SyncInterval = 0
	if err := c.Validate(); err != nil {
		t.Errorf("SyncOnWrite with SyncInterval 0: %v", err)
	}
	c.PayloadBytes, c.SlotAlign = 5000, 4096
	if got := c.SlotBytes(); got != 8192 {
		t.Errorf("SlotBytes = %d, want 8192", got)
	}
}

// TestReopen writes, overwrites and frees slots across slab files, closes,
// and reopens in every mode: every written slot reads its last payload,
// freed and never-written ones ErrEmpty.
func TestReopen(t *testing.T) {
	for _, d := range []disktier.Durability{disktier.SyncOnWrite, disktier.SyncPeriodic, disktier.SyncNone} {
		t.Run(d.String(), func(t *testing.T) {
			const slots, size = 10, 5000
			c := testConfig(t.TempDir(), slots, size)
			c.Durability = d
			c.SyncInterval = time.Hour
			tr, err := disktier.Open(c)
			if err != nil {
				t.Fatal(err)
			}
			ctx := ctxT(t)
			want := map[int][]byte{}
			for _, s := range []int{0, 2, 3, 7, 9} {
				want[s] = tiertest.Payload(s, 0, size)
				if err := tr.Write(ctx, s, want[s]); err != nil {
					t.Fatal(err)
				}
			}
			want[3] = tiertest.Payload(3, 1, size)
			if err := tr.Write(ctx, 3, want[3]); err != nil {
				t.Fatal(err)
			}
			if err := tr.Free(ctx, 7); err != nil {
				t.Fatal(err)
			}
			delete(want, 7)
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			tr = mustOpen(t, c)
			checkState(t, tr, want)
			if got := tr.Used(); !slices.Equal(got, []int{0, 2, 3, 9}) {
				t.Errorf("Used after reopen = %v", got)
			}
			a, err := tier.NewAllocator(tr.Slots(), tr.Used()...)
			if err != nil {
				t.Fatal(err)
			}
			if s, _ := a.Alloc(); s != 1 {
				t.Errorf("first free slot after reopen = %d, want 1", s)
			}
		})
	}
}

// checkState requires tr to hold exactly want.
func checkState(t *testing.T, tr tier.Tier, want map[int][]byte) {
	t.Helper()
	ctx := ctxT(t)
	dst := make([]byte, tr.PayloadBytes())
	for s := range tr.Slots() {
		err := tr.Read(ctx, s, dst)
		if p, ok := want[s]; ok {
			if err != nil || !bytes.Equal(dst, p) {
				t.Errorf("slot %d: err %v, equal %v; want its payload", s, err, bytes.Equal(dst, p))
			}
		} else if !errors.Is(err, tier.ErrEmpty) {
			t.Errorf("slot %d: %v, want ErrEmpty", s, err)
		}
	}
}

func TestReopenSlots(t *testing.T) {
	dir := t.TempDir()
	c := testConfig(dir, 8, 100)
	tr, _ := disktier.Open(c)
	ctx := ctxT(t)
	if err := tr.Write(ctx, 6, tiertest.Payload(6, 0, 100)); err != nil {
		t.Fatal(err)
	}
	_ = tr.Close()

	small := c
	small.Slots = 6
	if _, err := disktier.Open(small); !errors.Is(err, disktier.ErrMismatch) || !strings.Contains(err.Error(), dir) {
		t.Errorf("reopen with fewer slots than used: %v, want ErrMismatch naming the directory", err)
	}
	for name, mod := range map[string]func(*disktier.Config){
		"payload":        func(c *disktier.Config) { c.PayloadBytes = 101 },
		"slots per file": func(c *disktier.Config) { c.SlotsPerFile = 4 },
		"align":          func(c *disktier.Config) { c.SlotAlign = 512 },
	} {
		m := c
		mod(&m)
		if _, err := disktier.Open(m); !errors.Is(err, disktier.ErrMismatch) {
			t.Errorf("reopen with another %s: %v, want ErrMismatch", name, err)
		}
	}
	big := c
	big.Slots = 20
	tr = mustOpen(t, big)
	if err := tr.Write(ctx, 19, tiertest.Payload(19, 0, 100)); err != nil {
		t.Fatal(err)
	}
	checkState(t, tr, map[int][]byte{6: tiertest.Payload(6, 0, 100), 19: tiertest.Payload(19, 0, 100)})
	_ = tr.Close()
	c.Slots = 7
	if _, err := disktier.Open(c); !errors.Is(err, disktier.ErrMismatch) {
		t.Errorf("reopen with 7 slots while slot 19 is used: %v, want ErrMismatch", err)
	}
	tr = mustOpen(t, big)
	if err := tr.Free(ctx, 19); err != nil {
		t.Fatal(err)
	}
	_ = tr.Close()
	tr = mustOpen(t, c) // slot 6 fits
	checkState(t, tr, map[int][]byte{6: tiertest.Payload(6, 0, 100)})
}

func slabOffset(c disktier.Config, slot int) (string, int64) {
	return filepath.Join(c.Dir, fmt.Sprintf("slab-%06d", slot/c.SlotsPerFile)), int64(slot%c.SlotsPerFile) * c.SlotBytes()
}

// TestCorruptByte flips one byte of one slot in its slab file: that slot's
// Read is ErrCorrupt naming the slot and the file, with no bytes returned;
// the other slots read fine, before and after a reopen; a new Write heals
// the slot.
func TestCorruptByte(t *testing.T) {
	const slots, size = 6, 3000
	c := testConfig(t.TempDir(), slots, size)
	tr := mustOpen(t, c)
	ctx := ctxT(t)
	want := map[int][]byte{}
	for s := range slots {
		want[s] = tiertest.Payload(s, 0, size)
		if err := tr.Write(ctx, s, want[s]); err != nil {
			t.Fatal(err)
		}
	}
	path, off := slabOffset(c, 4)
	flip(t, path, off+1234)

	check := func(tr *disktier.Tier) {
		t.Helper()
		dst := bytes.Repeat([]byte{0xA5}, size)
		err := tr.Read(ctx, 4, dst)
		if !errors.Is(err, tier.ErrCorrupt) {
			t.Fatalf("Read of the corrupted slot: %v, want ErrCorrupt", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "slot 4") || !strings.Contains(msg, path) {
			t.Errorf("error %q does not name slot 4 and %s", msg, path)
		}
		if !bytes.Equal(dst, make([]byte, size)) {
			t.Error("corrupt Read left bytes in dst, want it zeroed")
		}
		for s := range slots {
			if s == 4 {
				continue
			}
			if err := tr.Read(ctx, s, dst); err != nil || !bytes.Equal(dst, want[s]) {
				t.Errorf("slot %d: %v", s, err)
			}
		}
	}
	check(tr)
	_ = tr.Close()
	tr = mustOpen(t, c)
	check(tr)
	if st := tr.Stats(); st.Corrupt != 1 {
		t.Errorf("Stats.Corrupt = %d, want 1", st.Corrupt)
	}
	// A corrupt slot can be freed or rewritten.
	if err := tr.Write(ctx, 4, want[4]); err != nil {
		t.Fatal(err)
	}
	checkState(t, tr, want)
}

func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestMisplacedPayload copies one slot's bytes over another's: the
// checksum covers the slot number, so it fails.
func TestMisplacedPayload(t *testing.T) {
	const size = 4096
	c := testConfig(t.TempDir(), 3, size)
	tr := mustOpen(t, c)
	ctx := ctxT(t)
	same := tiertest.Payload(0, 0, size)
	for s := range 2 {
		if err := tr.Write(ctx, s, same); err != nil {
			t.Fatal(err)
		}
	}
	// Identical payloads at slots 0 and 1 have different checksums, so
	// a write landing at the wrong one is detected; simulate it by
	// writing slot 1's bytes where slot 0's are, with other content.
	other := tiertest.Payload(1, 0, size)
	if err := tr.Write(ctx, 1, other); err != nil {
		t.Fatal(err)
	}
	path, off0 := slabOffset(c, 0)
	_, off1 := slabOffset(c, 1)
	f, _ := os.OpenFile(path, os.O_RDWR, 0)
	buf := make([]byte, size)
	if _, err := f.ReadAt(buf, off1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(buf, off0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := tr.Read(ctx, 0, buf); !errors.Is(err, tier.ErrCorrupt) {
		t.Errorf("slot 0 holding slot 1's payload: %v, want ErrCorrupt", err)
	}
}

// TestMissingAndShortSlab removes one slab file and truncates another:
// their used slots read ErrCorrupt.
func TestMissingAndShortSlab(t *testing.T) {
	const size = 4096
	c := testConfig(t.TempDir(), 9, size) // files of slots 0-2, 3-5, 6-8
	tr, _ := disktier.Open(c)
	ctx := ctxT(t)
	for _, s := range []int{0, 4, 8} {
		if err := tr.Write(ctx, s, tiertest.Payload(s, 0, size)); err != nil {
			t.Fatal(err)
		}
	}
	_ = tr.Close()
	p1, _ := slabOffset(c, 4)
	p2, off := slabOffset(c, 8)
	if err := os.Remove(p1); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p2, off+100); err != nil {
		t.Fatal(err)
	}
	tr = mustOpen(t, c)
	dst := make([]byte, size)
	for _, s := range []int{4, 8} {
		if err := tr.Read(ctx, s, dst); !errors.Is(err, tier.ErrCorrupt) {
			t.Errorf("slot %d: %v, want ErrCorrupt", s, err)
		}
	}
	if err := tr.Read(ctx, 0, dst); err != nil {
		t.Errorf("slot 0: %v", err)
	}
	if err := tr.Read(ctx, 5, dst); !errors.Is(err, tier.ErrEmpty) {
		t.Errorf("slot 5 (its file missing, never written): %v, want ErrEmpty", err)
	}
	// Writing recreates the file (and extends the short one).
	for _, s := range []int{4, 8} {
		if err := tr.Write(ctx, s, tiertest.Payload(s, 1, size)); err != nil {
			t.Fatal(err)
		}
	}
	checkState(t, tr, map[int][]byte{0: tiertest.Payload(0, 0, size), 4: tiertest.Payload(4, 1, size), 8: tiertest.Payload(8, 1, size)})
}

// TestBadIndex writes a malformed entry into the index: Open refuses the
// directory with ErrCorrupt.
func TestBadIndex(t *testing.T) {
	c := testConfig(t.TempDir(), 4, 64)
	tr, _ := disktier.Open(c)
	_ = tr.Write(ctxT(t), 1, tiertest.Payload(1, 0, 64))
	_ = tr.Close()
	db, err := bolt.Open(filepath.Join(c.Dir, "index.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("slots")).Put([]byte{0, 0, 0, 0, 0, 0, 0, 2}, []byte("junk"))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := disktier.Open(c); !errors.Is(err, tier.ErrCorrupt) || !strings.Contains(err.Error(), c.Dir) {
		t.Errorf("Open with a malformed entry: %v, want ErrCorrupt naming the directory", err)
	}
}

// TestJunkIndex: an index.db that is not a bbolt file is ErrCorrupt.
func TestJunkIndex(t *testing.T) {
	c := testConfig(t.TempDir(), 4, 64)
	if err := os.WriteFile(filepath.Join(c.Dir, "index.db"), bytes.Repeat([]byte("not bbolt "), 2000), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := disktier.Open(c); !errors.Is(err, tier.ErrCorrupt) {
		t.Errorf("Open with a junk index: %v, want ErrCorrupt", err)
	}
}

// TestInUse opens a directory twice in this process: the second Open
// fails fast with ErrInUse; after Close it succeeds.
func TestInUse(t *testing.T) {
	c := testConfig(t.TempDir(), 4, 64)
	first, err := disktier.Open(c)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = disktier.Open(c)
	if !errors.Is(err, disktier.ErrInUse) || !strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), c.Dir) {
		t.Errorf("second Open: %v, want ErrInUse naming the directory", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("second Open took %v, want about LockTimeout (%v)", d, c.LockTimeout)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again := mustOpen(t, c)
	_ = again.Close()
}

// TestInUseOtherProcess holds a directory open in a child process (this
// test binary, run as a helper): Open here fails with ErrInUse.
func TestInUseOtherProcess(t *testing.T) {
	if dir := os.Getenv("DISKTIER_HOLD_DIR"); dir != "" {
		tr, err := disktier.Open(testConfig(dir, 4, 64))
		if err != nil {
			os.Stdout.WriteString("open failed: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("holding\n")
		_, _ = os.Stdin.Read(make([]byte, 1)) // until the parent closes stdin
		_ = tr.Close()
		os.Exit(0)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestInUseOtherProcess$")
	cmd.Env = append(os.Environ(), "DISKTIER_HOLD_DIR="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	line := make([]byte, 64)
	n, _ := stdout.Read(line)
	if !strings.HasPrefix(string(line[:n]), "holding") {
		t.Fatalf("helper: %q", line[:n])
	}
	_, err = disktier.Open(testConfig(dir, 4, 64))
	if !errors.Is(err, disktier.ErrInUse) {
		t.Fatalf("Open of a directory held by another process: %v, want ErrInUse", err)
	}
	t.Logf("as reported: %v", err)
}
