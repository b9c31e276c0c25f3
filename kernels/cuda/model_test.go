//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// bf16Round rounds x to bfloat16 (nearest even), as the device stores it.
func bf16Round(x float32) float32 {
	b := math.Float32bits(x)
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b &^ 0xffff)
}

// TestGemvVariantsMatchFloat64 checks every compiled GEMV variant against
// a float64 reference on shapes that are not multiples of anything the
// kernels tile by (odd output counts, k not a multiple of 8: the scalar
// path), with every row count up to the variant's, outputs split in three
// and a residual added in place, with and without programmatic launch.
func TestGemvVariantsMatchFloat64(t *testing.T) {
	ctx := context.Background()
	be, err := New(Config{DType: plan.Float32})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	vec := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	type shape struct{ m, k int }
	// k = 1000 and 1288: lanes of a warp past k at different trips of the
	// k loop (the tensor-core GEMV must keep its warps converged).
	for _, sh := range []shape{{37, 1000}, {37, 1003}, {1, 8}, {300, 264}, {9, 4096}, {20, 1288}} {
		for _, dt := range []plan.DType{plan.Float32, plan.BFloat16} {
			wname, _ := weightName(dt)
			w := vec(sh.m * sh.k)
			if dt == plan.BFloat16 {
				for i := range w {
					w[i] = bf16Round(w[i])
				}
			}
			mat, err := be.UploadMatrix(ctx, w, sh.m, sh.k, dt)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range GemvKernels() {
				if v.Weights != wname || (v.Tensor && sh.k%8 != 0) {
					continue // the tensor-core GEMV takes k a multiple of 8 (TestGemvRefusals)
				}
				for _, rows := range []int{1, v.Rows} {
					for _, pdl := range []bool{false, true} {
						be.SetModelPDL(pdl)
						name := fmt.Sprintf("%dx%d/%v/rows%d/pdl=%v", sh.m, sh.k, v, rows, pdl)
						checkGemv(t, ctx, be, name, v, mat, w, sh.m, sh.k, rows, vec)
					}
				}
			}
			if err := be.FreeMatrix(ctx, mat); err != nil {
				t.Fatal(err)
			}
		}
	}
	be.SetModelPDL(false)
}

// checkGemv runs v on rows rows twice (outputs split in three; one output
// with a residual in place) and compares with float64 sums: the error
// allowed is float32 rounding of a sum of |w x| terms.
func checkGemv(t *testing.T, ctx context.Context, be *Backend, name string, v GemvKernel, mat kernels.Matrix, w []float32, m, k, rows int, vec func(int) []float32) {
	t.Helper()
	x := vec(rows * k)
	res := vec(rows * m)
	want := make([]float64, rows*m)
	tol := make([]float64, rows*m)
	for r := range rows {
		for o := range m {
			var s, a float64
			for j := range k {
				p := float64(w[o*k+j]) * float64(x[r*k+j])
				s += p
				a += math.Abs(p)
			}
			want[r*m+o] = s
			tol[r*m+o] = 1e-5*a + 1e-6 // fp32 sums of k terms in any order; a bf16 x would be off by ~4e-3 a
		}
	}
	alloc := func(src []float32) decode.Tensor {
		tt, err := be.AllocTensor(max(len(src), 1))
		if err != nil {
			t.Fatal(err)
		}
		if len(src) > 0 {
			if err := be.UploadTensor(tt, src); err != nil {
				t.Fatal(err)
			}
		}
		return tt.Slice(0, len(src))
	}
	xt := alloc(x)
	defer be.FreeTensor(xt)
	// Three outputs: widths m0, m1 and the rest.
	m0, m1 := m/3, m/3
	widths := []int{m0, m1, m - m0 - m1}
	var ys []decode.Tensor
	for _, wd := range widths {
		if wd == 0 {
			continue
		}
		y := alloc(make([]float32, rows*wd))
		defer be.FreeTensor(y)
		ys = append(ys, y)
	}
	if err := be.GemvWith(ctx, v, mat, xt, decode.Tensor{}, rows, ys...); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	got := make([]float32, rows*m)
	at := 0
	for _, y := range ys {
		out, err := be.DownloadTensor(ctx, y)
		if err != nil {
			t.Fatal(err)
		}
		wd := y.Len / rows
		for r := range rows {
			copy(got[r*m+at:r*m+at+wd], out[r*wd:(r+1)*wd])
		}
		at += wd
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol[i]) {
			t.Fatalf("%s split: output %d (row %d): %v, float64 %v (diff %.3g > %.3g)", name, i%m, i/m, got[i], want[i], d, tol[i])
		}
	}
	// One output with the residual added in place (y aliases res).
	y := alloc(res)
	defer be.FreeTensor(y)
	if err := be.GemvWith(ctx, v, mat, xt, y, rows, y); err != nil {
		t.Fatalf("%s residual: %v", name, err)
	}
	out, err := be.DownloadTensor(ctx, y)
	if err != nil {
		t.Fatal(err)
	}
	for i := range out {
		if d := math.Abs(float64(out[i]) - (want[i] + float64(res[i]))); !(d <= tol[i]+1e-6*math.Abs(float64(res[i]))) {
			t.Fatalf("%s residual: output %d: %v, float64 %v", name, i, out[i], want[i]+float64(res[i]))
		}
	}
}

// TestGemvRefusals: bad shapes are refused before any launch.
func TestGemvRefusals(t *testing.T) {
	ctx := context.Background()
	be, err := New(Config{DType: plan.Float32})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	mat, err := be.RandomMatrix(ctx, 12, 16, plan.BFloat16, 1, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer be.FreeMatrix(ctx, mat)
	odd, err := be.RandomMatrix(ctx, 12, 15, plan.BFloat16, 1, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer be.FreeMatrix(ctx, odd)
	x, _ := be.AllocTensor(2 * 16)
	y, _ := be.AllocTensor(2 * 12)
	defer be.FreeTensor(x)
	defer be.FreeTensor(y)
	for name, err := range map[string]error{
		"widths short":      be.GemvSplit(ctx, mat, x, 2, y.Slice(0, 2*5), y.Slice(2*5, 2*5)),
		"four outputs":      be.GemvSplit(ctx, mat, x, 2, y.Slice(0, 6), y.Slice(6, 6), y.Slice(12, 6), y.Slice(18, 6)),
		"x too short":       be.Gemv(ctx, y, mat, x.Slice(0, 16), decode.Tensor{}, 2),
		"variant too small": be.GemvWith(ctx, GemvKernel{"bf16", 1, 1, 4, true, false, false}, mat, x, decode.Tensor{}, 2, y),
		"variant f32":       be.GemvWith(ctx, GemvKernel{"f32", 4, 2, 2, true, false, false}, mat, x, decode.Tensor{}, 2, y),
		"residual split":    be.GemvWith(ctx, GemvKernel{"bf16", 4, 2, 2, true, false, false}, mat, x, y, 2, y.Slice(0, 12), y.Slice(12, 12)),
		"tensor k odd":      be.GemvWith(ctx, GemvKernel{"bf16", 8, 1, 2, true, true, false}, odd, x.Slice(0, 2*15), decode.Tensor{}, 2, y.Slice(0, 2*12)),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestBenchGemv (QUESTRT_BENCH=1) times every bf16 variant on the
// projections of a Llama-3.1-8B shape (q|k|v and gate|up fused) at 1 and
// 8 rows beside a device-to-device copy, and prints GB/s of weights
// streamed. Each shape cycles through enough copies of its matrix to
// exceed the L2 cache, 20 launches between two events, median of 5.
func TestBenchGemv(t *testing.T) {
	if os.Getenv("QUESTRT_BENCH") == "" {
		t.Skip("QUESTRT_BENCH not set")
	}
	ctx := context.Background()
	be, err := New(Config{DType: plan.BFloat16})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	var copyGB float64
	if err := be.do(ctx, func() error {
		var err error
		copyGB, err = be.copyBandwidth(1<<30, 10)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("copy: %.0f GB/s (read + write, 1 GiB device to device)", copyGB)
	type shape struct {
		name string
		m, k int
	}
	shapes := []shape{{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}, {"lm_head", 128256, 4096}}
	for _, pdl := range []bool{false, true} {
		be.SetModelPDL(pdl)
		for _, rows := range []int{1, 8} {
			for _, sh := range shapes {
				bytes := int64(sh.m) * int64(sh.k) * 2
				copies := int(max(1, min(8, (512<<20)/bytes+1)))
				mats := make([]kernels.Matrix, copies)
				for i := range mats {
					if mats[i], err = be.RandomMatrix(ctx, sh.m, sh.k, plan.BFloat16, uint64(i+1), 0.02, 0); err != nil {
						t.Fatal(err)
					}
				}
				x, _ := be.AllocTensor(rows * sh.k)
				y, _ := be.AllocTensor(rows * sh.m)
				var line []string
				best, bestGB := GemvKernel{}, 0.0
				for _, v := range GemvKernels() {
					if v.Weights != "bf16" || v.Rows < rows || (rows == 1 && v.Rows != 1 && !v.Tensor) || (rows > 1 && v.Rows != 8) {
						continue
					}
					us, err := benchLaunches(ctx, be, 20, 5, func(i int) error {
						return be.GemvWith(ctx, v, mats[i%copies], x, decode.Tensor{}, rows, y)
					})
					if err != nil {
						t.Fatal(err)
					}
					gb := float64(bytes) / us / 1e3
					line = append(line, fmt.Sprintf("%v %.1fus %.0fGB/s", v, us, gb))
					if gb > bestGB {
						best, bestGB = v, gb
					}
				}
				def := gemvDefault("bf16", rows, true)
				us, err := benchLaunches(ctx, be, 20, 5, func(i int) error {
					return be.Gemv(ctx, y, mats[i%copies], x, decode.Tensor{}, rows)
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("pdl=%v rows=%d %s %dx%d (%.1f MB): default %v %.1fus %.0f GB/s (%.0f%% of copy); best %v %.0f GB/s; all: %v",
					pdl, rows, sh.name, sh.m, sh.k, float64(bytes)/1e6, def, us, float64(bytes)/us/1e3, 100*float64(bytes)/us/1e3/copyGB, best, bestGB, line)
				be.FreeTensor(x)
				be.FreeTensor(y)
				for _, m := range mats {
					be.FreeMatrix(ctx, m)
				}
			}
		}
	}
}

// benchLaunches times n calls of f (launches on the default stream)
// between two events, reps times, and returns the median microseconds per
// call.
func benchLaunches(ctx context.Context, be *Backend, n, reps int, f func(i int) error) (float64, error) {
	for i := range n { // warm-up
		if err := f(i); err != nil {
			return 0, err
		}
	}
	var xs []float64
	for range reps {
		var start, end cu.Event
		err := be.do(ctx, func() error {
			var err error
			if start, err = cu.MakeEvent(cu.DefaultEvent); err != nil {
				return err
			}
			if end, err = cu.MakeEvent(cu.DefaultEvent); err != nil {
				return err
			}
			return start.Record(cu.Stream{})
		})
		if err != nil {
			return 0, err
		}
		for i := range n {
			if err := f(i); err != nil {
				return 0, err
			}
		}
		var ms float64
		err = be.do(ctx, func() error {
			defer cu.DestroyEvent(&start)
			defer cu.DestroyEvent(&end)
			if err := end.Record(cu.Stream{}); err != nil {
				return err
			}
			if err := end.Synchronize(); err != nil {
				return err
			}
			var err error
			ms, err = start.Elapsed(end)
			return err
		})
		if err != nil {
			return 0, err
		}
		xs = append(xs, ms*1e3/float64(n))
	}
	slices.Sort(xs)
	return xs[len(xs)/2], nil
}

// TestModelDevice runs the model-device suite (the twin's in CI) on the
// GPU: every model kernel against float64, random weights equal to
// backendtest.RandomWeight's.
func TestModelDevice(t *testing.T) {
	be, err := New(Config{DType: plan.Float32})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	for _, pdl := range []bool{false, true} {
		be.SetModelPDL(pdl)
		backendtest.RunModelDevice(t, be)
	}
}

// TestBenchSample (QUESTRT_BENCH=1) times Sample over a Llama-3 vocabulary
// (128,256 logits a row, N(0, 2), temperature 0.7, top-p 0.9) at 1 and 8
// rows, each call with its wait and the ids' copy back (wall time, median
// of 20 after 3 warm-ups), beside the host's model.Sampler on the same
// rows (what serving did with the logits copied back) and the greedy
// Argmax; every device token checked against the host's.
func TestBenchSample(t *testing.T) {
	if os.Getenv("QUESTRT_BENCH") == "" {
		t.Skip("QUESTRT_BENCH not set")
	}
	ctx := context.Background()
	be, err := New(Config{DType: plan.BFloat16})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	const v = 128256
	rng := rand.New(rand.NewPCG(3, 4))
	for _, rows := range []int{1, 8} {
		logits := make([]float32, rows*v)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64() * 2)
		}
		lt, err := be.AllocTensor(rows * v)
		if err != nil {
			t.Fatal(err)
		}
		if err := be.UploadTensor(lt, logits); err != nil {
			t.Fatal(err)
		}
		median := func(f func() error) float64 {
			var ms []float64
			for i := range 23 {
				t0 := time.Now()
				if err := f(); err != nil {
					t.Fatal(err)
				}
				if i >= 3 {
					ms = append(ms, float64(time.Since(t0).Microseconds())/1000)
				}
			}
			slices.Sort(ms)
			return ms[len(ms)/2]
		}
		ps := make([]kernels.SampleParams, rows)
		for i := range ps {
			ps[i] = kernels.SampleParams{Temperature: 0.7, TopP: 0.9, U: rng.Float64()}
		}
		dev := median(func() error { _, _, err := be.Sample(ctx, lt, rows, v, ps); return err })
		arg := median(func() error { _, err := be.Argmax(ctx, lt, rows, v); return err })
		got, _, err := be.Sample(ctx, lt, rows, v, ps)
		if err != nil {
			t.Fatal(err)
		}
		host := median(func() error {
			for r := range rows {
				s, _ := model.NewSampler(0.7, 0.9, 1)
				if id := s.SampleU(logits[r*v:(r+1)*v], ps[r].U); id != int(got[r]) {
					return fmt.Errorf("row %d: device %d, host %d", r, got[r], id)
				}
			}
			return nil
		})
		fmt.Printf("{\"bench\":\"sample\",\"vocab\":%d,\"rows\":%d,\"device_ms\":%.3f,\"argmax_ms\":%.3f,\"host_sampler_ms\":%.3f}\n", v, rows, dev, arg, host)
		be.FreeTensor(lt)
	}
}
