package completion

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/model/gpu"
	"github.com/questrt/questrt/plan"
)

// TestServeDevicePoolFromMemory: with CapacityPages 0 the device
// layout's pool (the executor on the CPU twin of a device, pages
// device-resident) is sized from the device's memory read after the
// executor's weights and workspace are allocated. The tiny model (2
// layers, 2 KV heads of 8 dims, pages of 16 tokens) costs, per page on
// the device, 2 layers x 2 heads x (K and V of 16 x 8 floats + a 2 x 8
// summary) x 4 bytes + an 8-byte page-table entry = 4360 bytes (fp8 K/V:
// 2 x 2 x (2 x 16 x 8 codes + 2 float32 scales + 2 x 8 float32 summary
// bytes) + 8 = 1320), beside the 256 MiB the backend keeps free. On a
// 300 MiB device 0.9 of it, less what the executor holds, bounds the
// pool; on a 4 GiB device --max-running requests of max_model_len do;
// a max_model_len of 65536 tokens (4096 pages) does not fit 300 MiB, and
// New refuses, naming the flags, before it allocates anything.
func TestServeDevicePoolFromMemory(t *testing.T) {
	m, tok := loadModel(t, writeTinyModel(t, "tiny", 65536))
	dev, x := twinExecutor(t, m, 0)
	used := dev.Allocated() // the executor's weights and activations
	if used <= 0 {
		t.Fatalf("the executor holds %d bytes of the device", used)
	}
	const reserve = 256 << 20
	base := testConfig("tiny")
	base.Backend, base.DeviceResident, base.Decoder = dev, true, &gpu.Decoder{X: x}
	base.CapacityPages, base.MaxContext = 0, 8192 // 512 pages a request

	for _, c := range []struct {
		name     string
		capacity int64
		dt       plan.DType
		page     int64
		want     int64
		bound    string
	}{
		{"f32 memory", 300 << 20, plan.Float32, 4360, (int64(0.9*(300<<20)) - used - reserve) / 4360, "memory"},
		{"fp8 memory", 290 << 20, plan.FP8, 1320, (int64(0.9*(290<<20)) - used - reserve) / 1320, "memory"},
		{"f32 max running", 4 << 30, plan.Float32, 4360, 16 * 512, "max running"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dev.Capacity = c.capacity
			t.Cleanup(func() { dev.Capacity = 0 })
			cfg := base
			cfg.KVDType = c.dt
			if c.want < 512 || (c.bound == "memory" && c.want >= 16*512) {
				t.Fatalf("test set-up: %d pages, want a pool of 512..8191 pages bounded by memory", c.want)
			}
			s, ts := startServer(t, m, tok, cfg)
			ps := s.PoolSize()
			t.Logf("%s: %d pages of %d bytes (%s), device %d of %d free, executor %d", c.name, ps.Pages, ps.PageBytes, ps.Bound, ps.Available, ps.Total, used)
			want := PoolSize{Pages: int(c.want), FromMemory: true, Device: true, Available: c.capacity - used, Total: c.capacity,
				Budget: int64(0.9*float64(c.capacity)) - used, Fraction: 0.9, PageBytes: c.page, FixedBytes: reserve, Bound: c.bound}
			if ps != want {
				t.Errorf("pool %+v\nwant %+v", ps, want)
			}
			if st := s.Stats(); st.CapacityPages != int(c.want) {
				t.Errorf("Stats.CapacityPages %d, want %d", st.CapacityPages, c.want)
			}
			if ps.Bytes() > ps.Budget || ps.Bytes()+c.page <= ps.Budget && c.bound == "memory" {
				t.Errorf("pool of %d bytes in a budget of %d: not the most pages that fit", ps.Bytes(), ps.Budget)
			}
			if got := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": "0123456789 ", "max_tokens": 6, "temperature": 0}); got.Usage.CompletionTokens != 6 {
				t.Errorf("completion on the sized pool: %+v", got.Usage)
			}
			// Options of its own would open an engine, and a pool, of
			// their own on the device beside the sized one: refused,
			// nothing reserved or opened.
			before := dev.Allocated()
			sink := s.cfg.Policy.SinkPages + 1
			status, _, body := post(t, ts.URL+"/v1/completions", `{"model": "tiny", "prompt": "0123456789 ", "max_tokens": 2, "quest": {"sink": `+strconv.Itoa(sink)+`}}`)
			if status != 400 || !strings.Contains(string(body), "--serve-capacity-pages") {
				t.Errorf("own options on a device pool sized from memory: status %d %s, want 400 naming --serve-capacity-pages", status, body)
			}
			if st := s.Stats(); st.ReservedPages != 0 || st.OwnEngines != 0 || dev.Allocated() != before {
				t.Errorf("after the refusal: %d pages reserved, %d own engines, device %d bytes (before %d)", st.ReservedPages, st.OwnEngines, dev.Allocated(), before)
			}
		})
	}

	// 65536 tokens need 4096 pages; 300 MiB holds about 2,700.
	dev.Capacity = 300 << 20
	defer func() { dev.Capacity = 0 }()
	cfg := base
	cfg.MaxContext = 0
	before := dev.Allocated()
	s, err := New(m, tok, cfg)
	if err == nil {
		s.Close()
		t.Fatal("a pool smaller than one request of max_model_len was accepted")
	}
	if !errors.Is(err, memlimit.ErrTooLarge) || strings.Count(err.Error(), "\n") > 0 {
		t.Errorf("refusal %q: want one line wrapping memlimit.ErrTooLarge", err)
	}
	t.Logf("refused: %v", err)
	for _, w := range []string{"--serve-capacity-pages", "--gpu-memory-utilization", "--max-model-len", "65536 tokens needs 4096", "4.3 KiB a page"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("refusal %q does not say %q", err, w)
		}
	}
	if dev.Allocated() != before {
		t.Errorf("the refused server left %d bytes allocated on the device (before: %d)", dev.Allocated(), before)
	}
	// A fraction the executor already exceeds leaves no budget.
	cfg.MaxContext, cfg.DeviceMemoryFraction = 8192, 0.5
	dev.Capacity = 2 * reserve
	if _, err := New(m, tok, cfg); err == nil || !strings.Contains(err.Error(), "needs 512") {
		t.Errorf("0.5 of 512 MiB with 256 MiB reserved: %v", err)
	}
	cfg.DeviceMemoryFraction = 1.5
	if _, err := New(m, tok, cfg); err == nil || !strings.Contains(err.Error(), "device memory fraction") {
		t.Errorf("fraction 1.5: %v", err)
	}
}
