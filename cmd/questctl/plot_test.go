package main

import (
	"image"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/questrt/questrt/cmd/questctl/internal/plots"
)

const resultsDir = "../../bench/results"

// decodePNG reads the PNG at path and returns its image.
func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return img
}

// notWhite is the share of pixels of img that are not near white.
func notWhite(img image.Image) float64 {
	b, n := img.Bounds(), 0
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r < 0xf000 || g < 0xf000 || bl < 0xf000 {
				n++
			}
		}
	}
	return float64(n) / float64(b.Dx()*b.Dy())
}

// onlyFiles lists the names in dir.
func onlyFiles(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// TestPlotConventions: the checks TestHelpAndErrorStreams makes of every
// command, for plot.
func TestPlotConventions(t *testing.T) {
	code, stdout, stderr := runCLI(t, "plot", "--help")
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage: questctl plot") || !strings.Contains(stdout, "Flags:") {
		t.Errorf("plot --help: exit %d, stderr %q, stdout starts %.60q", code, stderr, stdout)
	}
	code, stdout, stderr = runCLI(t, "plot", "--no-such-flag")
	if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "no-such-flag") {
		t.Errorf("plot --no-such-flag: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if _, stdout, _ := runCLI(t, "help"); !strings.Contains(stdout, "questctl plot") {
		t.Errorf("help does not list plot:\n%s", stdout)
	}
}

func TestPlotCommand(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		in, kind string
		w, h     int
	}{
		{"2026-12-01-passkey/v1.jsonl", "auto", 1850, 800},
		{"2026-12-01-passkey/v2_8k.jsonl", "passkey", 1850, 620},
		{"2026-12-01-passkey/v2_8k.jsonl,2026-12-01-passkey/v2_32k.jsonl", "auto", 0, 800},
		{"2026-11-29-attention-h200-mma.jsonl", "attention", 1790, 890},
	}
	for i, c := range cases {
		var in []string
		for _, f := range strings.Split(c.in, ",") {
			in = append(in, filepath.Join(resultsDir, f))
		}
		out := filepath.Join(dir, "fig"+string(rune('a'+i))+".png")
		code, stdout, stderr := runCLI(t, "plot", "--in", strings.Join(in, ","), "--out", out, "--kind", c.kind)
		if code != 0 || stdout != "" || !strings.HasPrefix(stderr, "wrote "+out) {
			t.Fatalf("plot --in %s: exit %d, stdout %q, stderr %q", c.in, code, stdout, stderr)
		}
		img := decodePNG(t, out)
		if b := img.Bounds(); c.w != 0 && b.Dx() != c.w || b.Dy() != c.h {
			t.Errorf("%s: image %v, want %dx%d", c.in, b, c.w, c.h)
		}
		if f := notWhite(img); f < 0.02 {
			t.Errorf("%s: blank figure (%.4f of the pixels drawn)", c.in, f)
		}
	}
	if names := onlyFiles(t, dir); len(names) != len(cases) {
		t.Errorf("files left: %q", names)
	}
}

// TestPlotBadInput: every mistake is a one-line usage error (exit 2) and
// writes nothing: no new file, an existing --out untouched, no temporary
// file left behind.
func TestPlotBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	passkey := filepath.Join(resultsDir, "2026-12-01-passkey/v1.jsonl")
	attention := filepath.Join(resultsDir, "2026-11-29-attention-h200-mma.jsonl")
	empty := write("empty.jsonl", "\n\n")
	garbled := write("garbled.jsonl", `{"length":2048,"selector":"dense","budget":0,"accuracy":1}`+"\n"+`{"length":2048,"selector":"quest","budget":64,"accuracy":`+"\n")
	progress := write("progress.jsonl", "context 4096 batch 1 budget 256: dense 12 us\n")
	denseOnly := write("dense.jsonl", `{"length":2048,"selector":"dense","budget":0,"accuracy":1}`+"\n")
	notDir := write("file.txt", "x")
	existing := write("existing.png", "keep me")
	out := filepath.Join(dir, "out.png")
	before := onlyFiles(t, dir)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--out", out}, "--in is required"},
		{[]string{"--in", passkey}, "--out is required"},
		{[]string{"--in", "", "--out", out}, "--in: empty value"},
		{[]string{"--in", passkey, "--out", out, "--kind", "pie"}, "--kind pie: want passkey, attention, collective or auto"},
		{[]string{"--in", filepath.Join(dir, "missing.jsonl"), "--out", out}, "missing.jsonl: no such file"},
		{[]string{"--in", passkey + ",", "--out", out}, "an empty file name"},
		{[]string{"--in", empty, "--out", out}, "empty.jsonl: no JSON lines"},
		{[]string{"--in", garbled, "--out", out}, "garbled.jsonl: line 2: not a JSON object"},
		{[]string{"--in", progress, "--out", out}, "progress.jsonl: line 1: not a JSON object"},
		{[]string{"--in", passkey, "--out", out, "--kind", "attention"}, "line 1: eval passkey line where bench attention lines are wanted"},
		{[]string{"--in", passkey + "," + attention, "--out", out}, "h200-mma.jsonl: line 1: bench attention line where eval passkey lines are wanted"},
		{[]string{"--in", denseOnly, "--out", out}, "only dense records"},
		{[]string{"--in", passkey, "--out", filepath.Join(dir, "out.svg")}, "--out " + filepath.Join(dir, "out.svg") + ": want a file name ending in .png"},
		{[]string{"--in", passkey, "--out", filepath.Join(dir, "no", "such", "out.png")}, "no such file or directory"},
		{[]string{"--in", passkey, "--out", filepath.Join(notDir, "out.png")}, "is not a directory"},
		{[]string{"--in", passkey, "--out", filepath.Join(dir, "dir.png")}, "is a directory"},
		{[]string{"--in", empty, "--out", existing}, "no JSON lines"},
		{[]string{"--in", passkey, "--out", out, "extra"}, "unexpected arguments"},
	}
	if err := os.Mkdir(filepath.Join(dir, "dir.png"), 0o755); err != nil {
		t.Fatal(err)
	}
	before = append(before, "dir.png")
	for _, c := range cases {
		code, stdout, stderr := runCLI(t, append([]string{"plot"}, c.args...)...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "questctl plot: ") || !strings.Contains(stderr, c.want) {
			t.Errorf("plot %q: exit %d, stdout %q, stderr %q; want a one-line usage error with %q", c.args, code, stdout, stderr, c.want)
		}
	}
	slices.Sort(before)
	if after := onlyFiles(t, dir); !slices.Equal(before, after) {
		t.Errorf("files before %q, after %q", before, after)
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Errorf("the existing --out was changed: %q", b)
	}
}

// TestPlotUnwritableDir: a directory without write permission is a usage
// error before anything is read.
func TestPlotUnwritableDir(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root writes anywhere")
	}
	dir := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCLI(t, "plot", "--in", filepath.Join(resultsDir, "2026-12-01-passkey/v1.jsonl"), "--out", filepath.Join(dir, "x.png"))
	if code != 2 || !strings.Contains(stderr, "cannot write in") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// TestBenchAttentionPlot: --plot draws the run's lines; a bad --plot is a
// usage error before the run.
func TestBenchAttentionPlot(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "attention.png")
	code, stdout, stderr := runCLI(t, "bench", "attention", "--context", "2048,4096", "--budget", "256", "--q-heads", "8", "--kv-heads", "2",
		"--head-dim", "32", "--iters", "2", "--json", "--max-memory", "1GiB", "--plot", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if n := strings.Count(stdout, "\n"); n != 2 {
		t.Errorf("%d JSON lines on stdout, want 2:\n%s", n, stdout)
	}
	img := decodePNG(t, out)
	if w, h := plots.AttentionSize(1, 1); img.Bounds() != image.Rect(0, 0, w, h) {
		t.Errorf("image %v, want %dx%d", img.Bounds(), w, h)
	}
	if f := notWhite(img); f < 0.02 {
		t.Errorf("blank figure (%.4f)", f)
	}
	code, stdout, stderr = runCLI(t, "bench", "attention", "--context", "4096", "--plot", filepath.Join(dir, "x.jpg"))
	if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "--plot") {
		t.Errorf("bad --plot: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestEvalPasskeyPlot: --plot draws the run's records; a bad --plot is a
// usage error before the model is loaded.
func TestEvalPasskeyPlot(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	dir := t.TempDir()
	out := filepath.Join(dir, "passkey.png")
	code, _, errs := call(evalCmd, "passkey", "--model", v1, "--lengths", "512", "--n", "1", "--budgets", "32,64", "--selectors", "quest,recent", "--plot", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	img := decodePNG(t, out)
	if w, h := plots.PasskeySize(1, 2); img.Bounds() != image.Rect(0, 0, w, h) {
		t.Errorf("image %v, want %dx%d", img.Bounds(), w, h)
	}
	if f := notWhite(img); f < 0.02 {
		t.Errorf("blank figure (%.4f)", f)
	}
	code, _, errs = call(evalCmd, "passkey", "--model", v1, "--plot", filepath.Join(dir, "no", "x.png"))
	if code != 2 || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, "--plot") {
		t.Errorf("bad --plot: exit %d, stderr %q", code, errs)
	}
}
