//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/plan"
)

// descKey is topk.cuh's desc_key: an order-preserving key, ascending for
// descending scores; -0 and +0 tie; a NaN ranks by its bits (a positive
// NaN above +Inf, a negative one below -Inf).
func descKey(f float32) uint32 {
	u := math.Float32bits(f)
	if f == 0 {
		u = 0
	}
	asc := u | 0x80000000
	if u&0x80000000 != 0 {
		asc = ^u
	}
	return ^asc
}

// keyTopK is the reference for rows with NaN scores (where the CPU
// backend's comparisons say nothing): the k smallest (desc_key, index)
// pairs, indices ascending.
func keyTopK(scores []float32, k int) []int32 {
	n := len(scores)
	if k >= n {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(i)
		}
		return out
	}
	c := make([]uint64, n)
	for i, s := range scores {
		c[i] = uint64(descKey(s))<<32 | uint64(i)
	}
	// Quickselect (the composites are distinct): c[:k] ends up the k
	// smallest.
	rng := rand.New(rand.NewPCG(1, 1))
	lo, hi, t := 0, n-1, k-1
	for lo < hi {
		p := c[lo+rng.IntN(hi-lo+1)]
		i, j := lo, hi
		for i <= j {
			for c[i] < p {
				i++
			}
			for c[j] > p {
				j--
			}
			if i <= j {
				c[i], c[j] = c[j], c[i]
				i++
				j--
			}
		}
		switch {
		case t <= j:
			hi = j
		case t >= i:
			lo = i
		default:
			lo = hi
		}
	}
	out := make([]int32, k)
	for i := range out {
		out[i] = int32(c[i] & 0xffffffff)
	}
	slices.Sort(out)
	return out
}

func hasNaN(s []float32) bool {
	for _, x := range s {
		if x != x {
			return true
		}
	}
	return false
}

// refTopK runs plan on the CPU backend (the reference) for the rows
// without NaN scores and with keyTopK for the others, into an output of
// outLen entries (slots no row writes stay -7).
func refTopK(t *testing.T, scores []float32, p *kernels.TopKPlan, outLen int) []int32 {
	t.Helper()
	out := make([]int32, outLen)
	for i := range out {
		out[i] = -7
	}
	var sub kernels.TopKPlan
	for r := range p.Rows() {
		row := scores[p.ScoreOff[r]:][:p.N[r]]
		if hasNaN(row) {
			for j, v := range keyTopK(row, int(p.K[r])) {
				out[int(p.OutOff[r])+j] = p.Base[r] + v
			}
			continue
		}
		sub.Add(int(p.ScoreOff[r]), int(p.N[r]), int(p.Base[r]), int(p.K[r]), int(p.OutOff[r]))
	}
	if sub.Rows() > 0 {
		cpu := kernels.NewCPU(kernels.CPUConfig{})
		defer cpu.Close()
		if err := cpu.TopK(context.Background(), scores, &sub, out); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// runTopKPath uploads scores and plan and runs one top-K path: "auto"
// (launchTopK's choice), "radix" (quest_topk_radix), "radix/<variant>"
// (topkRadixVariants; "radix/<variant>+fallback", "+nosmem" and "+direct"
// set a sample variant's flags) or "onestage" (quest_topk); output slots no
// row writes stay -7.
func runTopKPath(b *Backend, scores []float32, p *kernels.TopKPlan, path string) ([]int32, error) {
	outLen, err := p.Check(len(scores), math.MaxInt32)
	if err != nil {
		return nil, err
	}
	out := make([]int32, outLen)
	for i := range out {
		out[i] = -7
	}
	err = b.do(context.Background(), func() error {
		sp, err := upload(b, "tk.scores", scores)
		if err != nil {
			return err
		}
		var ptrs [5]cu.DevicePtr
		for i, a := range [][]int32{p.ScoreOff, p.N, p.Base, p.K, p.OutOff} {
			if ptrs[i], err = upload(b, fmt.Sprintf("tk.plan%d", i), a); err != nil {
				return err
			}
		}
		op, err := upload(b, "tk.out", out)
		if err != nil {
			return err
		}
		if err := launchTopKPath(b, p, path, sp, ptrs, op); err != nil {
			return err
		}
		return download(b, out, op)
	})
	return out, err
}

func launchTopKPath(b *Backend, p *kernels.TopKPlan, path string, sp cu.DevicePtr, ptrs [5]cu.DevicePtr, op cu.DevicePtr) error {
	return launchTopKPathTmax(b, p, path, sp, 0, ptrs, op)
}

// launchTopKPathTmax is launchTopKPath with tile maxima tp (laid out like
// the scores, as the score kernel writes them; 0 for none) for the
// threshold path "thr"; "twostage" forces the two-stage top-K.
func launchTopKPathTmax(b *Backend, p *kernels.TopKPlan, path string, sp, tp cu.DevicePtr, ptrs [5]cu.DevicePtr, op cu.DevicePtr) error {
	switch path {
	case "auto":
		return b.launchTopK(p, sp, tp, ptrs, op, false)
	case "thr":
		return b.launch("quest_topk_thr", [3]int{p.Rows(), 1, 1}, 1024, 0, u(sp), u(tp), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(op))
	case "twostage":
		slice, slices, kmax := topkSlices(p)
		if slices == 0 {
			return fmt.Errorf("two-stage top-K does not take this plan")
		}
		return b.launchTopKTwoStage(p, sp, ptrs, op, slice, slices, kmax)
	case "radix":
		return b.launchTopKRadix(p, sp, ptrs, op)
	case "onestage":
		return b.launch("quest_topk", [3]int{p.Rows(), 1, 1}, 1024, 0, u(sp), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(op))
	}
	if v, ok := variantOfPath(path); ok {
		return b.launchTopKVariant(p, sp, ptrs, op, v)
	}
	return fmt.Errorf("no top-K path %q", path)
}

// variantOfPath parses "radix/<variant>[+fallback|+nosmem|+direct]".
func variantOfPath(path string) (topkVariant, bool) {
	name, ok := strings.CutPrefix(path, "radix/")
	if !ok {
		return topkVariant{}, false
	}
	name, flag, _ := strings.Cut(name, "+")
	v, ok := topkVariantByName(name)
	if !ok || (flag != "" && v.kernel == "") {
		return topkVariant{}, false
	}
	switch flag {
	case "":
	case "fallback":
		v.flags |= topkSampleFallback
	case "nosmem":
		v.flags |= topkSampleNoSmem
	case "direct":
		v.flags |= topkSampleDirect
	default:
		return topkVariant{}, false
	}
	return v, true
}

// variantPaths names every variant's path, and with flags also the sample
// variants' test-flag paths.
func variantPaths(flags bool) []string {
	var paths []string
	for _, v := range topkRadixVariants {
		paths = append(paths, "radix/"+v.name)
	}
	if flags {
		for _, v := range topkRadixVariants {
			if v.kernel != "" {
				paths = append(paths, "radix/"+v.name+"+nosmem", "radix/"+v.name+"+fallback")
			}
		}
	}
	return paths
}

// sampleStats is the statistics block of the sample variants' control
// words (SAMP_STATS): rows finished, of them through the one-block
// fallback and through the global-memory narrowing, and the candidates
// (C) per row, mean and largest. reset zeroes it.
type sampleStats struct {
	finishes, fallbacks, global int
	meanC                       float64
	maxC                        int
}

// readSampleStats reads (device goroutine) the statistics since the last
// reset, and resets them when reset is set.
func readSampleStats(b *Backend, reset bool) (sampleStats, error) {
	bf, ok := b.bufs["topk.sample.ctrl"]
	if !ok {
		return sampleStats{}, nil
	}
	w := make([]int32, topkSampleStats)
	if err := download(b, w, bf.ptr); err != nil {
		return sampleStats{}, err
	}
	st := sampleStats{finishes: int(w[4]), fallbacks: int(w[0]), global: int(w[1]), maxC: int(w[6])}
	if st.finishes > 0 {
		st.meanC = float64(uint64(uint32(w[2]))|uint64(uint32(w[3]))<<32) / float64(st.finishes)
	}
	if reset {
		if err := cu.MemsetD32Async(bf.ptr, 0, topkSampleStats, cu.Stream{}); err != nil {
			return st, err
		}
	}
	return st, nil
}

// topkPath names the path launchTopK takes for p.
func topkPath(p *kernels.TopKPlan) string {
	if topkThr(p) {
		return "thr"
	}
	if slices, _, _ := topkSlices(p); slices > 0 {
		return "two-stage"
	}
	if topkRadix(p) {
		return "radix"
	}
	return "one-block"
}

// scoreGen fills a row of scores with one distribution.
type scoreGen struct {
	name string
	fill func(rng *rand.Rand, s []float32)
}

var (
	posNaN = math.Float32frombits(0x7fc00000)
	negNaN = math.Float32frombits(0xffc00001)
	negInf = float32(math.Inf(-1))
)

var scoreGens = []scoreGen{
	{"uniform", func(rng *rand.Rand, s []float32) {
		for i := range s {
			s[i] = rng.Float32()
		}
	}},
	// Like Quest upper bounds: one exponent band, so the first 12-bit
	// digit leaves thousands of candidates.
	{"normal", func(rng *rand.Rand, s []float32) {
		for i := range s {
			s[i] = float32(100 + 10*rng.NormFloat64())
		}
	}},
	{"bf16", func(rng *rand.Rand, s []float32) {
		for i := range s {
			s[i] = backendtest.RoundBF16(float32(20 * rng.NormFloat64()))
		}
	}},
	{"equal", func(_ *rand.Rand, s []float32) {
		for i := range s {
			s[i] = 1.5
		}
	}},
	{"levels3", func(rng *rand.Rand, s []float32) {
		for i := range s {
			s[i] = float32(rng.IntN(3))*0.5 - 0.5
		}
	}},
	{"zeros", func(rng *rand.Rand, s []float32) { // +0 and -0 tie; a few 1s
		for i := range s {
			switch rng.IntN(2000) {
			case 0:
				s[i] = 1
			default:
				s[i] = float32(math.Copysign(0, float64(rng.IntN(2)*2-1)))
			}
		}
	}},
	{"neginf", func(rng *rand.Rand, s []float32) { // half -Inf
		for i := range s {
			s[i] = rng.Float32()
			if rng.IntN(2) == 0 {
				s[i] = negInf
			}
		}
	}},
	{"allneginf", func(rng *rand.Rand, s []float32) { // -Inf but for 5 scores
		for i := range s {
			s[i] = negInf
		}
		for range 5 {
			s[rng.IntN(len(s))] = rng.Float32()
		}
	}},
	{"nan", func(rng *rand.Rand, s []float32) { // 1% NaN of each sign, some +Inf
		for i := range s {
			s[i] = rng.Float32()
			switch rng.IntN(200) {
			case 0:
				s[i] = posNaN
			case 1:
				s[i] = negNaN
			case 2:
				s[i] = float32(math.Inf(1))
			}
		}
	}},
	{"mostlynan", func(rng *rand.Rand, s []float32) {
		for i := range s {
			s[i] = rng.Float32()
			if rng.IntN(10) != 0 {
				s[i] = posNaN
			}
		}
	}},
}

func genByName(name string) scoreGen {
	for _, g := range scoreGens {
		if g.name == name {
			return g
		}
	}
	panic(name)
}

// checkTopK runs p through the dispatch ("auto") and the forced radix
// select and compares every output slot with the reference.
func checkTopK(t *testing.T, b *Backend, name string, scores []float32, p *kernels.TopKPlan, paths ...string) {
	t.Helper()
	outLen, err := p.Check(len(scores), math.MaxInt32)
	if err != nil {
		t.Fatal(err)
	}
	want := refTopK(t, scores, p, outLen)
	for _, path := range paths {
		got, err := runTopKPath(b, scores, p, path)
		if err != nil {
			t.Fatalf("%s (%s): %v", name, path, err)
		}
		for r := range p.Rows() {
			oo, m := int(p.OutOff[r]), min(int(p.K[r]), int(p.N[r]))
			for j := oo; j < oo+m; j++ {
				if got[j] != want[j] {
					t.Fatalf("%s (%s, dispatch %s) row %d (n=%d k=%d): entry %d is %d, want %d",
						name, path, topkPath(p), r, p.N[r], p.K[r], j-oo, got[j], want[j])
				}
			}
		}
		for j := range got {
			if got[j] != want[j] {
				t.Fatalf("%s (%s): output slot %d is %d, want %d (a slot no row owns was written)", name, path, j, got[j], want[j])
			}
		}
	}
}

var (
	longSizes = []int{65537, 200000, 655360, 1000003, 4194304, 16777216}
	longKs    = []int{1, 7, 256, 4096}
)

// TestTopKLongRows: one-row plans (the most blocks per row) of every long
// size, distribution and k, through the dispatch and the forced radix
// select, against the CPU backend (keyTopK for NaN rows).
func TestTopKLongRows(t *testing.T) {
	b := newBackend(t, plan.BFloat16)
	defer b.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	for _, n := range longSizes {
		gens := scoreGens
		if n >= 4194304 && testing.Short() {
			gens = []scoreGen{genByName("normal"), genByName("equal"), genByName("nan")}
		}
		scores := make([]float32, n)
		for _, g := range gens {
			g.fill(rng, scores)
			for _, k := range longKs {
				var p kernels.TopKPlan
				p.Add(0, n, 5, k, 0)
				checkTopK(t, b, fmt.Sprintf("n=%d %s k=%d", n, g.name, k), scores, &p, "auto", "radix")
			}
		}
	}
}

// TestTopKLongBatch: plans of 8 rows mixing long rows (different
// distributions and k) with short ones, k >= n, k = 0 and an empty row, at
// unaligned score offsets, for every long size.
func TestTopKLongBatch(t *testing.T) {
	b := newBackend(t, plan.BFloat16)
	defer b.Close()
	rng := rand.New(rand.NewPCG(13, 14))
	type row struct {
		n, k int
		gen  string
	}
	for i, L := range longSizes {
		rows := []row{
			{L, longKs[i%4], scoreGens[i%len(scoreGens)].name},
			{L - 1, longKs[(i+1)%4], scoreGens[(i+3)%len(scoreGens)].name},
			{9, 3, "levels3"},
			{70001, 7, "normal"},
			{L/3 + 1, longKs[(i+2)%4], scoreGens[(i+6)%len(scoreGens)].name},
			{1000, 2000, "uniform"}, // k > n
			{5, 0, "uniform"},       // k = 0
			{0, 4, "uniform"},       // empty
		}
		if L <= 1000003 { // an eighth long row where the scores are cheap
			rows[6] = row{L + 3, 4096, "equal"}
		}
		var scores []float32
		var p kernels.TopKPlan
		off := 0
		for j, r := range rows {
			scores = append(scores, make([]float32, 3)...) // unaligned offsets
			s := make([]float32, r.n)
			genByName(r.gen).fill(rng, s)
			p.Add(len(scores), r.n, 100*j, r.k, off)
			scores = append(scores, s...)
			off += min(r.k, r.n)
		}
		if got := topkPath(&p); got != "radix" {
			t.Fatalf("L=%d: dispatch %s, want radix", L, got)
		}
		checkTopK(t, b, fmt.Sprintf("batch L=%d", L), scores, &p, "auto", "radix")
	}
	// Eight long rows of one size, the benchmark's shape.
	for _, L := range []int{655360, 4194304} {
		var scores []float32
		var p kernels.TopKPlan
		for j := range 8 {
			s := make([]float32, L)
			scoreGens[j%len(scoreGens)].fill(rng, s)
			p.Add(len(scores), L, 0, 256, j*256)
			scores = append(scores, s...)
		}
		checkTopK(t, b, fmt.Sprintf("8 rows of %d", L), scores, &p, "auto", "radix")
	}
}

// TestTopKRadixShort forces the radix select on short and mid-size rows
// (rows that gather in the first pass, rows whose candidates come from a
// buffer, k = n-1, k = 1, budgets over 512 and up to 4096, ties and NaNs),
// which the dispatch sends elsewhere.
func TestTopKRadixShort(t *testing.T) {
	b := newBackend(t, plan.BFloat16)
	defer b.Close()
	rng := rand.New(rand.NewPCG(15, 16))
	type row struct{ n, k int }
	sets := [][]row{
		{{1, 1}, {2, 1}, {10, 3}, {3072, 3071}, {3073, 3072}, {3073, 4096}, {4097, 4096}, {5000, 600}},
		{{65536, 4096}, {65536, 1}, {100000, 513}, {20000, 512}, {70000, 2048}, {8191, 8190 / 2}},
		{{300000, 4096}, {300000, 1000}, {2, 1}},
	}
	for si, set := range sets {
		for _, g := range scoreGens {
			var scores []float32
			var p kernels.TopKPlan
			off := 0
			for j, r := range set {
				s := make([]float32, r.n)
				g.fill(rng, s)
				p.Add(len(scores), r.n, j, r.k, off)
				scores = append(scores, s...)
				off += min(r.k, r.n)
			}
			checkTopK(t, b, fmt.Sprintf("set %d %s", si, g.name), scores, &p, "radix")
		}
	}
}

// variantRow is one row of a variant test plan: n scores from generator
// gen, keeping k.
type variantRow struct {
	n, k int
	gen  string
}

// variantPlan lays rows out at unaligned score offsets.
func variantPlan(rng *rand.Rand, rows []variantRow) ([]float32, kernels.TopKPlan) {
	var scores []float32
	var p kernels.TopKPlan
	off := 0
	for j, r := range rows {
		scores = append(scores, make([]float32, 3)...)
		s := make([]float32, r.n)
		genByName(r.gen).fill(rng, s)
		p.Add(len(scores), r.n, 100*j, r.k, off)
		scores = append(scores, s...)
		off += min(r.k, r.n)
	}
	return scores, p
}

// TestTopKLongVariants runs every variant of topkRadixVariants (and the
// sample variants with their test flags: every row through the one-block
// fallback, or through the global-memory narrowing) on the same plans
// against the CPU backend: short and mid-size rows with every
// distribution, the benchmark's shape (8 rows of 655,360) with mixed
// distributions and budgets, rows of 4M and 16M.
func TestTopKLongVariants(t *testing.T) {
	b := newBackend(t, plan.BFloat16)
	defer b.Close()
	rng := rand.New(rand.NewPCG(17, 18))
	all, plain := variantPaths(true), variantPaths(false)
	t.Logf("paths: %v", all)
	short := []struct{ n, k int }{{1, 1}, {2, 1}, {10, 3}, {3072, 3071}, {3073, 3072}, {3073, 4096}, {4097, 4096},
		{5000, 600}, {8191, 4095}, {20000, 512}, {65536, 4096}, {70000, 2048}, {100000, 513}, {100000, 1}, {9, 0}}
	for _, g := range scoreGens {
		var rows []variantRow
		for _, r := range short {
			rows = append(rows, variantRow{r.n, r.k, g.name})
		}
		scores, p := variantPlan(rng, rows)
		checkTopK(t, b, "short "+g.name, scores, &p, all...)
	}
	const L = 655360
	var bench, mixed []variantRow
	for j := range 8 {
		bench = append(bench, variantRow{L, 256, scoreGens[j%len(scoreGens)].name})
		mixed = append(mixed, variantRow{L - j, longKs[j%4], scoreGens[(j+8)%len(scoreGens)].name})
	}
	scores, p := variantPlan(rng, bench)
	checkTopK(t, b, "8 rows of 655360, k 256", scores, &p, all...)
	mixed = append(mixed, variantRow{1000, 2000, "uniform"}, variantRow{0, 4, "uniform"}, variantRow{70001, 7, "normal"})
	scores, p = variantPlan(rng, mixed)
	checkTopK(t, b, "655360 mixed", scores, &p, all...)
	scores, p = variantPlan(rng, []variantRow{{4194304, 256, "normal"}, {4194304, 4096, "equal"}, {4194303, 7, "nan"}, {9, 3, "levels3"}})
	checkTopK(t, b, "4M", scores, &p, all...)
	if !testing.Short() {
		scores, p = variantPlan(rng, []variantRow{{16777216, 256, "normal"}, {16777215, 4096, "levels3"}})
		checkTopK(t, b, "16M", scores, &p, plain...)
	}
}

// TestTopKSampleAdversarial lays scores out with the sample's period
// (a group of 8 every 512 scores, the sample of 655,360-score rows with
// mmax 10,240; every 1,024 with 5,120), so that the sample misleads: the
// sampled scores far below the others (nearly every entry becomes a
// candidate: the global-memory narrowing) or far above them (fewer
// candidates than k: the one-block fallback). Every variant must stay
// exact, and the sample variants must have taken the fallback.
func TestTopKSampleAdversarial(t *testing.T) {
	b := newBackend(t, plan.BFloat16)
	defer b.Close()
	rng := rand.New(rand.NewPCG(19, 20))
	const L = 655360
	var scores []float32
	var p kernels.TopKPlan
	off := 0
	for j, c := range []struct {
		k     int
		level float32
	}{{256, -1000}, {256, 1000}, {4096, -1000}, {1000, 1000}} {
		s := make([]float32, L)
		for i := range s {
			s[i] = float32(100 + 10*rng.NormFloat64())
			if i%512 < 8 {
				s[i] = c.level + float32(rng.NormFloat64())
			}
		}
		p.Add(len(scores), L, j, c.k, off)
		scores = append(scores, s...)
		off += c.k
	}
	for _, path := range variantPaths(false) {
		if err := b.do(context.Background(), func() error { _, err := readSampleStats(b, true); return err }); err != nil {
			t.Fatal(err)
		}
		checkTopK(t, b, "adversarial", scores, &p, path)
		var st sampleStats
		if err := b.do(context.Background(), func() (err error) { st, err = readSampleStats(b, true); return }); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %+v", path, st)
		if v, _ := variantOfPath(path); v.kernel != "" && (st.finishes != 4 || st.fallbacks != 2 || st.global != 2) {
			t.Errorf("%s: %+v, want 4 finishes, 2 fallbacks (the rows of high samples) and 2 global narrowings", path, st)
		}
	}
}

// BenchmarkTopKLong times top-K of 8 rows x n scores (Quest-like normal
// scores), k = 256, with CUDA events: the one-block radix select
// (quest_topk, the old path), every multi-block variant side by side
// (radix/<variant> for each of topkRadixVariants; radix/v0 is
// quest_topk_radix) and the dispatch's choice, in us per call with the
// scores in L2 (us/call, as after the score kernel) and after an L2 flush
// (cold-us/call). The 8192 and 32768 rows are a decode step's rows at
// 128K and 512K tokens (S = 16); the 65536 and 131072 rows are for tuning
// topkRadixMinN (the dispatch takes the threshold and two-stage kernels
// there).
//
// The sample variants also report their candidates per row (cand/row: mean C) and
// the share of rows that took the global-memory narrowing (global/row) or
// the one-block fallback (fallback/row).
//
//	cd kernels/cuda && ../../.gpubuild/cuda.test -test.run '^$' -test.bench TopKLong -test.benchtime 100x
func BenchmarkTopKLong(b *testing.B) {
	for _, n := range []int{8192, 32768, 65536, 131072, 655360, 4194304} {
		paths := append(append([]string{"onestage"}, variantPaths(false)...), "auto")
		if n <= topkThrMaxN {
			// The threshold kernel with the tile maxima the score kernel
			// writes in a step, and the two-stage kernels where they apply.
			paths = append(paths, "thr", "thr+tmax")
			var p kernels.TopKPlan
			for r := range 8 {
				p.Add(r*n, n, 0, 256, r*256)
			}
			if _, slices, _ := topkSlices(&p); slices > 0 {
				paths = append(paths, "twostage")
			}
		}
		for _, path := range paths {
			b.Run(fmt.Sprintf("n%d_rows8_k256/%s", n, path), func(b *testing.B) { benchTopKLong(b, n, 8, 256, path) })
		}
	}
}

// longTopKInput is the long-row benchmarks' input: rows rows of n
// Quest-like scores (normal, mean 100, deviation 10; seeded), each row
// keeping k.
func longTopKInput(n, rows, k int) ([]float32, kernels.TopKPlan) {
	rng := rand.New(rand.NewPCG(21, 22))
	scores := make([]float32, n*rows)
	for i := range scores {
		scores[i] = float32(100 + 10*rng.NormFloat64())
	}
	var p kernels.TopKPlan
	for r := range rows {
		p.Add(r*n, n, 0, k, r*k)
	}
	return scores, p
}

func benchTopKLong(b *testing.B, n, rows, k int, path string) {
	be, err := New(Config{DType: plan.BFloat16})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	scores, p := longTopKInput(n, rows, k)
	if path == "auto" {
		b.Logf("dispatch: %s", topkPath(&p))
	}
	var warm, cold float64
	var st sampleStats
	err = be.do(context.Background(), func() error {
		sp, err := upload(be, "bench.tk.scores", scores)
		if err != nil {
			return err
		}
		var ptrs [5]cu.DevicePtr
		for i, a := range [][]int32{p.ScoreOff, p.N, p.Base, p.K, p.OutOff} {
			if ptrs[i], err = upload(be, fmt.Sprintf("bench.tk.plan%d", i), a); err != nil {
				return err
			}
		}
		op, err := be.buf("bench.tk.out", int64(rows*k)*4)
		if err != nil {
			return err
		}
		var tp cu.DevicePtr
		if path == "thr+tmax" {
			if tp, err = upload(be, "bench.tk.tmax", tileMaxima(scores, &p)); err != nil {
				return err
			}
		}
		if err := cu.Synchronize(); err != nil {
			return err
		}
		f := func() error { return launchTopKPathTmax(be, &p, strings.TrimSuffix(path, "+tmax"), sp, tp, ptrs, op) }
		if err := f(); err != nil { // (allocates the buffers)
			return err
		}
		if _, err := readSampleStats(be, true); err != nil {
			return err
		}
		tm, err := newTimer()
		if err != nil {
			return err
		}
		defer tm.destroy()
		b.ResetTimer()
		if warm, err = tm.median(b.N, f); err != nil {
			return err
		}
		b.StopTimer()
		if cold, err = be.cold(20, f); err != nil {
			return err
		}
		st, err = readSampleStats(be, false)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(warm, "us/call")
	b.ReportMetric(cold, "cold-us/call")
	if st.finishes > 0 {
		b.ReportMetric(st.meanC, "cand/row")
		b.ReportMetric(float64(st.global)/float64(st.finishes), "global/row")
		b.ReportMetric(float64(st.fallbacks)/float64(st.finishes), "fallback/row")
		b.Logf("%s: %+v", path, st)
	}
}

// tileMaxima is the score kernel's tile maxima output for scores and p:
// laid out like the scores, entry ScoreOff[r]+t the maximum of row r's
// scores 8t..8t+7.
func tileMaxima(scores []float32, p *kernels.TopKPlan) []float32 {
	tm := make([]float32, len(scores))
	for r := range p.Rows() {
		row := scores[p.ScoreOff[r]:][:p.N[r]]
		for t := 0; 8*t < len(row); t++ {
			m := float32(math.Inf(-1))
			for _, x := range row[8*t : min(len(row), 8*t+8)] {
				m = max(m, x)
			}
			tm[int(p.ScoreOff[r])+t] = m
		}
	}
	return tm
}

// BenchmarkTopKThrPhases times the threshold top-K's phases
// (quest_topk_thr_prof: the SM clock at each phase's end, thread 0 of each
// block) on 8 rows x n Quest-like scores, k = 256, with the tile maxima a
// step's score kernel writes: cycles from the start to the end of the tile
// maxima (c1), the threshold (c2), the qualifying tiles (c3), the gather of
// candidates (c4), the cut's histogram (c5), the ranking of the cut's ties
// (c6) and the output (c7), the mean over rows of the last call; also the
// qualifying tiles, candidates and ties at the cut per row.
//
//	cd kernels/cuda && ../../.gpubuild/cuda.test -test.run '^$' -test.bench TopKThrPhases -test.benchtime 50x
func BenchmarkTopKThrPhases(b *testing.B) {
	for _, n := range []int{8192, 32768, 65536} {
		b.Run(fmt.Sprintf("n%d_rows8_k256", n), func(b *testing.B) {
			const rows, k = 8, 256
			be, err := New(Config{DType: plan.BFloat16})
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			scores, p := longTopKInput(n, rows, k)
			prof := make([]int64, 16*rows)
			var warm float64
			err = be.do(context.Background(), func() error {
				sp, err := upload(be, "bench.tk.scores", scores)
				if err != nil {
					return err
				}
				tp, err := upload(be, "bench.tk.tmax", tileMaxima(scores, &p))
				if err != nil {
					return err
				}
				var ptrs [5]cu.DevicePtr
				for i, a := range [][]int32{p.ScoreOff, p.N, p.Base, p.K, p.OutOff} {
					if ptrs[i], err = upload(be, fmt.Sprintf("bench.tk.plan%d", i), a); err != nil {
						return err
					}
				}
				op, err := be.buf("bench.tk.out", int64(rows*k)*4)
				if err != nil {
					return err
				}
				pp, err := upload(be, "bench.tk.prof", prof)
				if err != nil {
					return err
				}
				f := func() error {
					return be.launch("quest_topk_thr_prof", [3]int{rows, 1, 1}, 1024, 0, u(sp), u(tp), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(op), u(pp))
				}
				if err := f(); err != nil {
					return err
				}
				tm, err := newTimer()
				if err != nil {
					return err
				}
				defer tm.destroy()
				b.ResetTimer()
				if warm, err = tm.median(b.N, f); err != nil {
					return err
				}
				b.StopTimer()
				return download(be, prof, pp)
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(warm, "us/call")
			for ph := 1; ph <= 7; ph++ {
				var sum float64
				for r := range rows {
					sum += float64(prof[16*r+ph] - prof[16*r])
				}
				b.ReportMetric(sum/rows, fmt.Sprintf("c%d", ph))
			}
			for i, name := range []string{"tiles/row", "cand/row", "cut/row"} {
				var sum float64
				for r := range rows {
					sum += float64(prof[16*r+10+i])
				}
				b.ReportMetric(sum/rows, name)
			}
		})
	}
}
