package completion

import (
	"errors"
	"strings"
	"testing"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/model"
)

// fakeMeminfo is /proc/meminfo's text with MemAvailable kb kB.
func fakeMeminfo(kb int) func() (int64, error) {
	text := "MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   " +
		itoa(kb) + " kB\nBuffers:          100000 kB\n"
	return func() (int64, error) { return memlimit.ParseMemAvailable([]byte(text)) }
}

// TestPoolPages: the arithmetic of a pool sized from memory, worked by
// hand: the pages of fraction x available less the fixed bytes (and the
// monitor's slack), bounded by max running requests of the longest
// context and refusing nothing itself.
func TestPoolPages(t *testing.T) {
	for _, c := range []struct {
		name                 string
		avail                int64
		fraction             float64
		fixed, per           int64
		slack, need, running int
		want                 int
		bound                string
	}{
		// 1 GiB x 0.5 = 536870912 B; (536870912 - 1000) / 4096 = 131071.76.
		{"memory", 1 << 30, 0.5, 1000, 4096, 0, 0, 16, 131071, "memory"},
		// The monitor's 64 pages of slack come off the pool.
		{"slack", 1 << 30, 0.5, 1000, 4096, 64, 0, 16, 131007, "memory"},
		// 16 requests of 2048 pages: 32768 < 131071.
		{"max running", 1 << 30, 0.5, 0, 4096, 0, 2048, 16, 32768, "max running"},
		// 0.9 x 10000 B = 9000; (9000 - 0) / 4360 = 2.06.
		{"fraction", 10000, 0.9, 0, 4360, 0, 1, 16, 2, "memory"},
		// The fixed bytes exceed the budget: nothing.
		{"none", 10000, 0.5, 6000, 10, 0, 0, 16, 0, "memory"},
	} {
		got, bound := poolPages(c.avail, c.fraction, c.fixed, c.per, c.slack, c.need, c.running)
		if got != c.want || bound != c.bound {
			t.Errorf("%s: %d pages (%s), want %d (%s)", c.name, got, bound, c.want, c.bound)
		}
	}
}

// tinyPageBytes is the host bytes of one page of writeTinyModel on a
// 1 x 1 grid, from the model's shape alone: per layer and KV head, K and
// V of 16 slots x D 8 float32 and a summary (min and max of D floats),
// plus 8 bytes of the page's metadata.
const tinyPageBytes = 2*2*(2*16*8*4+2*8*4) + 8

// TestServerPoolFromMemory: CapacityPages 0 sizes the pool from the
// available memory (fake meminfo text): half of it over the bytes of a
// page, at most MaxRunning requests of the model's context; a positive
// MemoryLimit caps the memory; a memory where not even one request of
// max_model_len fits fails New with an error naming the flags.
func TestServerPoolFromMemory(t *testing.T) {
	dir := writeTinyModel(t, "tiny-pool", 4096)
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := model.LoadTokenizer(dir, m.Config)
	if err != nil {
		t.Fatal(err)
	}
	const oneRequest = 4096 / 16 // pages of a 4096-token context
	for _, c := range []struct {
		name     string
		kb       int
		limit    int64
		want     int
		bound    string
		wantFail bool
	}{
		// 4000 kB x 1024 x 0.5 = 2048000 B over 4360 B a page: 469.
		{"memory", 4000, -1, 2048000 / tinyPageBytes, "memory", false},
		// 16 GB: 16 requests of 256 pages.
		{"max running", 16 << 20, -1, 16 * oneRequest, "max running", false},
		// A 3 MB limit under 16 GB available: 1.5 MB / 4360 = 360.
		{"limit", 16 << 20, 3000000, 1500000 / tinyPageBytes, "memory", false},
		// 1000 kB: 117 pages, less than one request's 256.
		{"too small", 1000, -1, 0, "", true},
	} {
		cfg := testConfig("tiny-pool")
		cfg.CapacityPages = 0
		cfg.MemoryLimit = c.limit
		cfg.MemAvailable = fakeMeminfo(c.kb)
		s, err := New(m, tok, cfg)
		if c.wantFail {
			if err == nil {
				s.Close()
				t.Fatalf("%s: New succeeded", c.name)
			}
			for _, w := range []string{"--serve-capacity-pages", "--serve-memory-fraction", "--max-model-len", "4096 tokens needs 256"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %q does not say %q", c.name, err, w)
				}
			}
			if !errors.Is(err, memlimit.ErrTooLarge) {
				t.Errorf("%s: error %v does not wrap ErrTooLarge", c.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		ps := s.PoolSize()
		if !ps.FromMemory || ps.PageBytes != tinyPageBytes || ps.Pages != c.want || ps.Bound != c.bound {
			t.Errorf("%s: pool %+v, want %d pages (%s) of %d B", c.name, ps, c.want, c.bound, tinyPageBytes)
		}
		if st := s.Stats(); st.CapacityPages != c.want {
			t.Errorf("%s: Stats().CapacityPages %d, want %d", c.name, st.CapacityPages, c.want)
		}
		s.Close()
	}
	// An explicit pool is used as given.
	cfg := testConfig("tiny-pool")
	cfg.MemAvailable = func() (int64, error) { t.Error("memory read for an explicit pool"); return 0, nil }
	s, err := New(m, tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ps := s.PoolSize(); ps.FromMemory || ps.Pages != 512 {
		t.Errorf("explicit pool: %+v, want 512 pages as given", ps)
	}
	s.Close()
}
