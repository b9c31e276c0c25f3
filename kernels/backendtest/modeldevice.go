package backendtest

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// RunModelDevice is the conformance suite of a kernels.ModelDevice: each
// operation against a float64 reference (or exactly, where no rounding
// is involved) on shapes that are not multiples of what kernels tile by,
// and the refusals of bad shapes. The CPU twin runs it in CI; the CUDA
// backend's tests run it on a GPU.
func RunModelDevice(t *testing.T, dev kernels.ModelDevice) {
	t.Run("RandomMatrix", func(t *testing.T) { testRandomMatrix(t, dev) })
	t.Run("Embed", func(t *testing.T) { testEmbed(t, dev) })
	t.Run("RMSNorm", func(t *testing.T) { testRMSNorm(t, dev) })
	t.Run("Gemv", func(t *testing.T) { testGemv(t, dev) })
	t.Run("GemvNorm", func(t *testing.T) { testGemvNorm(t, dev) })
	t.Run("GemmRows", func(t *testing.T) { testGemmRows(t, dev) })
	t.Run("Rope", func(t *testing.T) { testRope(t, dev) })
	t.Run("SiluMul", func(t *testing.T) { testSiluMul(t, dev) })
	t.Run("Argmax", func(t *testing.T) { testArgmax(t, dev) })
	t.Run("Sample", func(t *testing.T) { testSample(t, dev) })
}

// RandomWeight is element i of a random matrix of seed (offset + scale
// * u, u uniform in [-1, 1) from a splitmix64 hash of seed and i) before
// its rounding to the matrix's type: what every ModelDevice's
// RandomMatrix makes, so that random weights are the same on every
// device.
func RandomWeight(seed uint64, i int64, scale, offset float32) float32 {
	z := seed*0x9e3779b97f4a7c15 + uint64(i)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return offset + scale*(float32(z>>40)*(1.0/8388608.0)-1)
}

// upload allocates a device tensor holding src.
func upload(t *testing.T, dev kernels.ModelDevice, src []float32) decode.Tensor {
	t.Helper()
	x, err := dev.AllocTensor(len(src))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.FreeTensor(x) })
	if err := dev.UploadTensor(x, src); err != nil {
		t.Fatal(err)
	}
	return x
}

func download(t *testing.T, dev kernels.ModelDevice, x decode.Tensor) []float32 {
	t.Helper()
	out, err := dev.DownloadTensor(context.Background(), x)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func randVec(rng *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * scale)
	}
	return x
}

func roundAll(dt plan.DType, x []float32) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = roundTo(dt, v)
	}
	return out
}

func testRandomMatrix(t *testing.T, dev kernels.ModelDevice) {
	ctx := context.Background()
	for _, dt := range []plan.DType{plan.Float32, plan.BFloat16} {
		m, err := dev.RandomMatrix(ctx, 7, 37, dt, 11, 0.5, 1)
		if err != nil {
			t.Fatal(err)
		}
		// Embed reads the rows back exactly.
		ids := []int32{0, 6, 3}
		out := upload(t, dev, make([]float32, len(ids)*37))
		if err := dev.Embed(ctx, out, m, ids); err != nil {
			t.Fatal(err)
		}
		got := download(t, dev, out)
		for r, id := range ids {
			for j := range 37 {
				want := roundTo(dt, RandomWeight(11, int64(id)*37+int64(j), 0.5, 1))
				if g := got[r*37+j]; g != want || g < 0.5 || g > 1.5 {
					t.Fatalf("%v: element [%d][%d] = %v, want %v (in [0.5, 1.5])", dt, id, j, g, want)
				}
			}
		}
		dev.FreeMatrix(ctx, m)
	}
}

func testEmbed(t *testing.T, dev kernels.ModelDevice) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 1))
	const v, h = 300, 33
	table := roundAll(plan.BFloat16, randVec(rng, v*h, 1))
	m, err := dev.UploadMatrix(ctx, table, v, h, plan.BFloat16)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.FreeMatrix(ctx, m)
	ids := []int32{299, 0, 17, 17}
	out := upload(t, dev, make([]float32, len(ids)*h))
	if err := dev.Embed(ctx, out, m, ids); err != nil {
		t.Fatal(err)
	}
	got := download(t, dev, out)
	for r, id := range ids {
		for j := range h {
			if got[r*h+j] != table[int(id)*h+j] {
				t.Fatalf("row %d (token %d) element %d: %v, want %v", r, id, j, got[r*h+j], table[int(id)*h+j])
			}
		}
	}
	for _, bad := range [][]int32{{300}, {-1}} {
		if err := dev.Embed(ctx, out.Slice(0, h), m, bad); err == nil {
			t.Errorf("token %d embedded", bad[0])
		}
	}
}

func testRMSNorm(t *testing.T, dev kernels.ModelDevice) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(2, 2))
	for _, h := range []int{1000, 4096} {
		for _, dt := range []plan.DType{plan.Float32, plan.BFloat16} {
			const rows = 3
			const eps = 1e-5
			w := roundAll(dt, randVec(rng, h, 1))
			wm, err := dev.UploadMatrix(ctx, w, 1, h, dt)
			if err != nil {
				t.Fatal(err)
			}
			x := randVec(rng, rows*h, 3)
			for i := range h {
				x[i] *= 1e-3 // row 0: eps outweighs the mean square
			}
			xt := upload(t, dev, x)
			out := upload(t, dev, make([]float32, rows*h))
			if err := dev.RMSNorm(ctx, out, xt, wm, rows, eps); err != nil {
				t.Fatal(err)
			}
			got := download(t, dev, out)
			for r := range rows {
				var ss float64
				for _, v := range x[r*h : (r+1)*h] {
					ss += float64(v) * float64(v)
				}
				s := 1 / math.Sqrt(ss/float64(h)+eps)
				for i := range h {
					want := float64(w[i]) * float64(x[r*h+i]) * s
					if d := math.Abs(float64(got[r*h+i]) - want); d > 5e-6*math.Abs(want)+1e-7 {
						t.Fatalf("h %d %v row %d element %d: %v, float64 %v", h, dt, r, i, got[r*h+i], want)
					}
				}
			}
			// In place (out = x) gives the same.
			if err := dev.RMSNorm(ctx, xt, xt, wm, rows, eps); err != nil {
				t.Fatal(err)
			}
			if in := download(t, dev, xt); !slices.Equal(in, got) {
				t.Errorf("h %d %v: RMSNorm in place differs", h, dt)
			}
			dev.FreeMatrix(ctx, wm)
		}
	}
}

func testGemv(t *testing.T, dev kernels.ModelDevice) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 3))
	for _, sh := range []struct{ m, k, rows int }{{37, 1000, 1}, {37, 1000, 5}, {70, 1003, 3}, {9, 4096, 16}, {300, 264, 8}} {
		for _, dt := range []plan.DType{plan.Float32, plan.BFloat16} {
			w := roundAll(dt, randVec(rng, sh.m*sh.k, 1))
			wm, err := dev.UploadMatrix(ctx, w, sh.m, sh.k, dt)
			if err != nil {
				t.Fatal(err)
			}
			x := randVec(rng, sh.rows*sh.k, 1)
			res := randVec(rng, sh.rows*sh.m, 1)
			xt := upload(t, dev, x)
			y := upload(t, dev, res)
			if err := dev.Gemv(ctx, y, wm, xt, y, sh.rows); err != nil {
				t.Fatal(err)
			}
			got := download(t, dev, y)
			// Split in three (the last one empty when m < 3 would make it so).
			m0, m1 := sh.m/3, sh.m/3
			parts := []decode.Tensor{upload(t, dev, make([]float32, sh.rows*m0)), upload(t, dev, make([]float32, sh.rows*m1)),
				upload(t, dev, make([]float32, sh.rows*(sh.m-m0-m1)))}
			if err := dev.GemvSplit(ctx, wm, xt, sh.rows, parts...); err != nil {
				t.Fatal(err)
			}
			split := [][]float32{download(t, dev, parts[0]), download(t, dev, parts[1]), download(t, dev, parts[2])}
			for r := range sh.rows {
				for o := range sh.m {
					var s, a float64
					for j := range sh.k {
						p := float64(w[o*sh.k+j]) * float64(x[r*sh.k+j])
						s += p
						a += math.Abs(p)
					}
					tol := 1e-5*a + 1e-6
					if d := math.Abs(float64(got[r*sh.m+o]) - s - float64(res[r*sh.m+o])); d > tol+1e-6*math.Abs(float64(res[r*sh.m+o])) {
						t.Fatalf("%dx%d %v rows %d: residual output [%d][%d] off by %g", sh.m, sh.k, dt, sh.rows, r, o, d)
					}
					seg, at, width := 0, o, m0
					if o >= m0+m1 {
						seg, at, width = 2, o-m0-m1, sh.m-m0-m1
					} else if o >= m0 {
						seg, at, width = 1, o-m0, m1
					}
					if d := math.Abs(float64(split[seg][r*width+at]) - s); d > tol {
						t.Fatalf("%dx%d %v rows %d: split output [%d][%d] off by %g", sh.m, sh.k, dt, sh.rows, r, o, d)
					}
				}
			}
			if err := dev.GemvSplit(ctx, wm, xt, sh.rows, parts[0]); err == nil {
				t.Errorf("%dx%d: outputs narrower than the matrix accepted", sh.m, sh.k)
			}
			dev.FreeMatrix(ctx, wm)
		}
	}
}

// testGemvNorm checks GemvNorm against RMSNorm then the GEMV in float64,
// on the paths a device may take: k not a multiple of 8, 1 to 17 rows
// (more than one launch of 16), the split outputs.
func testGemvNorm(t *testing.T, dev kernels.ModelDevice) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(6, 6))
	const eps = 1e-5
	for _, sh := range []struct{ m, k, rows int }{{37, 1000, 1}, {70, 1003, 3}, {40, 4096, 2}, {33, 264, 8}, {19, 512, 17}} {
		for _, dt := range []plan.DType{plan.Float32, plan.BFloat16} {
			w := roundAll(dt, randVec(rng, sh.m*sh.k, 1))
			nw := roundAll(dt, randVec(rng, sh.k, 1))
			wm, err := dev.UploadMatrix(ctx, w, sh.m, sh.k, dt)
			if err != nil {
				t.Fatal(err)
			}
			nm, err := dev.UploadMatrix(ctx, nw, 1, sh.k, dt)
			if err != nil {
				t.Fatal(err)
			}
			x := randVec(rng, sh.rows*sh.k, 3)
			xt := upload(t, dev, x)
			m0 := sh.m / 2
			parts := []decode.Tensor{upload(t, dev, make([]float32, sh.rows*m0)), upload(t, dev, make([]float32, sh.rows*(sh.m-m0)))}
			if err := dev.GemvNorm(ctx, wm, xt, nm, eps, sh.rows, parts...); err != nil {
				t.Fatal(err)
			}
			got := [][]float32{download(t, dev, parts[0]), download(t, dev, parts[1])}
			if in := download(t, dev, xt); !slices.Equal(in, x) {
				t.Fatalf("%dx%d %v: GemvNorm changed x", sh.m, sh.k, dt)
			}
			for r := range sh.rows {
				xr := x[r*sh.k : (r+1)*sh.k]
				var ss float64
				for _, v := range xr {
					ss += float64(v) * float64(v)
				}
				sc := 1 / math.Sqrt(ss/float64(sh.k)+eps)
				for o := range sh.m {
					var s, a float64
					for j, v := range xr {
						p := float64(w[o*sh.k+j]) * float64(nw[j]) * float64(v) * sc
						s += p
						a += math.Abs(p)
					}
					seg, at, width := 0, o, m0
					if o >= m0 {
						seg, at, width = 1, o-m0, sh.m-m0
					}
					if d := math.Abs(float64(got[seg][r*width+at]) - s); d > 1e-5*a+1e-6 {
						t.Fatalf("%dx%d %v rows %d: output [%d][%d] = %v, float64 %v", sh.m, sh.k, dt, sh.rows, r, o, got[seg][r*width+at], s)
					}
				}
			}
			short, err := dev.UploadMatrix(ctx, nw[:sh.k-1], 1, sh.k-1, dt)
			if err != nil {
				t.Fatal(err)
			}
			if err := dev.GemvNorm(ctx, wm, xt, short, eps, sh.rows, parts...); err == nil {
				t.Errorf("%dx%d %v: norm weights of %d accepted", sh.m, sh.k, dt, sh.k-1)
			}
			for _, m := range []kernels.Matrix{wm, nm, short} {
				dev.FreeMatrix(ctx, m)
			}
		}
	}
}

// RunGemmRows runs RunModelDevice's check of projections of many rows
// alone (for each GEMM variant of a device).
func RunGemmRows(t *testing.T, dev kernels.ModelDevice) { testGemmRows(t, dev) }

// testGemmRows checks Gemv, GemvSplit and GemvNorm of many rows (a
// prompt chunk's projections: a device may run them as a GEMM with x
// rounded to bf16 on the tensor cores, as kernels.ModelDevice allows)
// against float64: every output within 1e-5 of the sum of the absolute
// products of either the exact x or x rounded to bf16 (after the norm,
// whose scale may round differently: 2e-4 there). Shapes with odd rows and
// outputs that are not multiples of the device's tiles.
func testGemmRows(t *testing.T, dev kernels.ModelDevice) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 9))
	const eps = 1e-5
	for _, sh := range []struct{ m, k, rows int }{{130, 264, 100}, {300, 1024, 257}, {1000, 72, 64}, {64, 4096, 129}} {
		w := roundAll(plan.BFloat16, randVec(rng, sh.m*sh.k, 1))
		nw := roundAll(plan.BFloat16, randVec(rng, sh.k, 1))
		wm, err := dev.UploadMatrix(ctx, w, sh.m, sh.k, plan.BFloat16)
		if err != nil {
			t.Fatal(err)
		}
		nm, err := dev.UploadMatrix(ctx, nw, 1, sh.k, plan.BFloat16)
		if err != nil {
			t.Fatal(err)
		}
		x := randVec(rng, sh.rows*sh.k, 3)
		res := randVec(rng, sh.rows*sh.m, 1)
		xt := upload(t, dev, x)
		y := upload(t, dev, res)
		if err := dev.Gemv(ctx, y, wm, xt, y, sh.rows); err != nil {
			t.Fatal(err)
		}
		got := download(t, dev, y)
		m0, m1 := sh.m/3, sh.m/3+1
		widths := []int{m0, m1, sh.m - m0 - m1}
		parts := make([]decode.Tensor, 3)
		for i, wd := range widths {
			parts[i] = upload(t, dev, make([]float32, sh.rows*wd))
		}
		if err := dev.GemvSplit(ctx, wm, xt, sh.rows, parts...); err != nil {
			t.Fatal(err)
		}
		split := [][]float32{download(t, dev, parts[0]), download(t, dev, parts[1]), download(t, dev, parts[2])}
		nparts := []decode.Tensor{upload(t, dev, make([]float32, sh.rows*m0)), upload(t, dev, make([]float32, sh.rows*(sh.m-m0)))}
		if err := dev.GemvNorm(ctx, wm, xt, nm, eps, sh.rows, nparts...); err != nil {
			t.Fatal(err)
		}
		normed := [][]float32{download(t, dev, nparts[0]), download(t, dev, nparts[1])}
		if in := download(t, dev, xt); !slices.Equal(in, x) {
			t.Fatalf("%dx%d rows %d: the projections changed x", sh.m, sh.k, sh.rows)
		}
		// seg finds output o among outputs of widths ws.
		seg := func(o int, ws ...int) (int, int, int) {
			for i, wd := range ws {
				if o < wd {
					return i, o, wd
				}
				o -= wd
			}
			panic("output outside the widths")
		}
		dot := func(r, o int, xr func(j int) float64) (s, a float64) {
			for j := range sh.k {
				p := float64(w[o*sh.k+j]) * xr(j)
				s += p
				a += math.Abs(p)
			}
			return s, a
		}
		for r := range sh.rows {
			var ss float64
			for _, v := range x[r*sh.k : (r+1)*sh.k] {
				ss += float64(v) * float64(v)
			}
			sc := 1 / math.Sqrt(ss/float64(sh.k)+eps)
			for o := range sh.m {
				s, a := dot(r, o, func(j int) float64 { return float64(x[r*sh.k+j]) })
				sb, _ := dot(r, o, func(j int) float64 { return float64(RoundBF16(x[r*sh.k+j])) })
				near := func(got float32, ref ...float64) bool {
					for _, v := range ref {
						if math.Abs(float64(got)-v) <= 1e-5*a+1e-6 {
							return true
						}
					}
					return false
				}
				rv := float64(res[r*sh.m+o])
				if g := got[r*sh.m+o]; !near(g, s+rv, sb+rv) {
					t.Fatalf("%dx%d rows %d: residual output [%d][%d] = %v, float64 %v (x as bf16: %v)", sh.m, sh.k, sh.rows, r, o, g, s+rv, sb+rv)
				}
				i, at, wd := seg(o, widths...)
				if g := split[i][r*wd+at]; !near(g, s, sb) {
					t.Fatalf("%dx%d rows %d: split output [%d][%d] = %v, float64 %v (x as bf16: %v)", sh.m, sh.k, sh.rows, r, o, g, s, sb)
				}
				sn, an := dot(r, o, func(j int) float64 { return float64(x[r*sh.k+j]) * sc * float64(nw[j]) })
				snb, _ := dot(r, o, func(j int) float64 {
					return float64(RoundBF16(float32(float64(x[r*sh.k+j]) * sc * float64(nw[j]))))
				})
				i, at, wd = seg(o, m0, sh.m-m0)
				g := normed[i][r*wd+at]
				if d := min(math.Abs(float64(g)-sn), math.Abs(float64(g)-snb)); d > 2e-4*an+1e-6 && math.Abs(float64(g)-sn) > 1e-5*an+1e-6 {
					t.Fatalf("%dx%d rows %d: normed output [%d][%d] = %v, float64 %v (x as bf16: %v)", sh.m, sh.k, sh.rows, r, o, g, sn, snb)
				}
			}
		}
		for _, m := range []kernels.Matrix{wm, nm} {
			dev.FreeMatrix(ctx, m)
		}
	}
}

// testRope rotates q and k (different head counts) in one call, and q
// alone.
func testRope(t *testing.T, dev kernels.ModelDevice) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(4, 4))
	const qh, kh, d = 3, 2, 128
	positions := []int{0, 1, 8191, 8192, 131071, 1_000_000}
	rows := len(positions)
	// cos/sin of plain rotary angles at theta 500000, as float32 (the
	// kernel rotates by what it is given; the angles' own accuracy at
	// long positions is the host's, tested in package model).
	cs := make([]float32, rows*d)
	for r, pos := range positions {
		for i := range d / 2 {
			ang := float64(pos) * math.Pow(500000, -2*float64(i)/d)
			cs[(r*d/2+i)*2], cs[(r*d/2+i)*2+1] = float32(math.Cos(ang)), float32(math.Sin(ang))
		}
	}
	check := func(what string, x, got []float32, heads int) {
		t.Helper()
		for r := range rows {
			for h := range heads {
				v := x[(r*heads+h)*d : (r*heads+h+1)*d]
				g := got[(r*heads+h)*d : (r*heads+h+1)*d]
				for i := range d / 2 {
					c, s := float64(cs[(r*d/2+i)*2]), float64(cs[(r*d/2+i)*2+1])
					a, b := float64(v[i]), float64(v[i+d/2])
					for _, e := range []struct {
						got  float32
						want float64
					}{{g[i], a*c - b*s}, {g[i+d/2], b*c + a*s}} {
						if diff := math.Abs(float64(e.got) - e.want); diff > 1e-6*(math.Abs(a)+math.Abs(b))+1e-7 {
							t.Fatalf("%s: position %d head %d pair %d: %v, float64 %v", what, positions[r], h, i, e.got, e.want)
						}
					}
				}
			}
		}
	}
	q, k := randVec(rng, rows*qh*d, 1), randVec(rng, rows*kh*d, 1)
	qt, kt, ct := upload(t, dev, q), upload(t, dev, k), upload(t, dev, cs)
	if err := dev.Rope(ctx, qt, kt, rows, qh, kh, d, ct); err != nil {
		t.Fatal(err)
	}
	check("q", q, download(t, dev, qt), qh)
	check("k", k, download(t, dev, kt), kh)
	q = download(t, dev, qt)
	if err := dev.Rope(ctx, qt, decode.Tensor{}, rows, qh, 0, d, ct); err != nil {
		t.Fatal(err)
	}
	check("q alone", q, download(t, dev, qt), qh)
	before := download(t, dev, qt)
	for what, err := range map[string]error{
		"cos/sin of one row for six": dev.Rope(ctx, qt, kt, rows, qh, kh, d, ct.Slice(0, d)),
		"k heads without k":          dev.Rope(ctx, qt, decode.Tensor{}, rows, qh, kh, d, ct),
		"k too short":                dev.Rope(ctx, qt, kt.Slice(0, d), rows, qh, kh, d, ct),
	} {
		if err == nil {
			t.Errorf("%s accepted", what)
		}
	}
	if !slices.Equal(download(t, dev, qt), before) {
		t.Error("a refused Rope changed q")
	}
}

func testSiluMul(t *testing.T, dev kernels.ModelDevice) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 5))
	g := randVec(rng, 1001, 4)
	u := randVec(rng, 1001, 1)
	gt, ut := upload(t, dev, g), upload(t, dev, u)
	if err := dev.SiluMul(ctx, gt, ut); err != nil {
		t.Fatal(err)
	}
	got := download(t, dev, gt)
	for i := range g {
		x := float64(g[i])
		want := x / (1 + math.Exp(-x)) * float64(u[i])
		if d := math.Abs(float64(got[i]) - want); d > 1e-6*math.Abs(want)+1e-7 {
			t.Fatalf("element %d: silu(%v) * %v = %v, float64 %v", i, g[i], u[i], got[i], want)
		}
	}
}

func testArgmax(t *testing.T, dev kernels.ModelDevice) {
	ctx := context.Background()
	const v = 3001
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	rows := make([]float32, 5*v)
	for i := range v {
		rows[0*v+i] = float32(i % 1000) // ties: 999 at 999, 1999, 2999
		rows[1*v+i] = -float32(i)       // the first
		rows[2*v+i] = float32(i)        // the last
		rows[3*v+i] = nan               // none: 0
		rows[4*v+i] = inf               // none: 0
	}
	rows[1*v+2500] = nan // NaN is never the largest
	want := []int32{999, 0, v - 1, 0, 0}
	lt := upload(t, dev, rows)
	got, err := dev.Argmax(ctx, lt, 5, v)
	if err != nil {
		t.Fatal(err)
	}
	for r := range want {
		if got[r] != want[r] {
			t.Errorf("row %d: argmax %d, want %d", r, got[r], want[r])
		}
	}
	// Rows longer than eight strides of a 1,024-thread block (a kernel may
	// read several of a thread's elements at once): ties within one
	// thread's batch of reads, across batches and threads, and the last
	// element.
	const w = 20011
	long := make([]float32, 3*w)
	for _, i := range []int{5 + 3*1024, 5 + 6*1024, 2 + 12*1024} {
		long[i] = 7 // the first: 3077
	}
	long[w+w-1] = 1 // the last
	for _, i := range []int{1 + 16*1024, 1 + 8*1024, 9 + 8*1024} {
		long[2*w+i] = -0.5 // below the zeros: the first zero
	}
	long[2*w+0] = -1
	wantLong := []int32{5 + 3*1024, w - 1, 1}
	gotLong, err := dev.Argmax(ctx, upload(t, dev, long), 3, w)
	if err != nil {
		t.Fatal(err)
	}
	for r := range wantLong {
		if gotLong[r] != wantLong[r] {
			t.Errorf("row %d of %d logits: argmax %d, want %d", r, w, gotLong[r], wantLong[r])
		}
	}
}
