package plots

import (
	"bytes"
	"errors"
	"flag"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dumpDir keeps the test figures for a look: go test -args -dump DIR.
var dumpDir = flag.String("dump", "", "write the figures drawn from bench/results to this directory")

const results = "../../../../bench/results"

func readFiles(t *testing.T, kind Kind, paths ...string) *Data {
	t.Helper()
	d := &Data{Kind: kind}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		err = d.Read(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	return d
}

// render draws d's figure and decodes the PNG.
func render(t *testing.T, d *Data, name string) (*Figure, image.Image) {
	t.Helper()
	fig, err := d.Figure()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := fig.WritePNG(&b); err != nil {
		t.Fatal(err)
	}
	if *dumpDir != "" {
		if err := os.WriteFile(filepath.Join(*dumpDir, name), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatalf("the figure is not a PNG: %v", err)
	}
	return fig, img
}

// inked is the share of pixels that are not near white.
func inked(img image.Image) float64 {
	b := img.Bounds()
	n := 0
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r < 0xf000 || g < 0xf000 || bl < 0xf000 {
				n++
			}
		}
	}
	return float64(n) / float64(b.Dx()*b.Dy())
}

// inkedIn is the share of non-white pixels in the rectangle of the image
// given as fractions of its width and height.
func inkedIn(img image.Image, x0, y0, x1, y1 float64) float64 {
	b := img.Bounds()
	r := image.Rect(int(x0*float64(b.Dx())), int(y0*float64(b.Dy())), int(x1*float64(b.Dx())), int(y1*float64(b.Dy())))
	return inked(img.(interface {
		SubImage(image.Rectangle) image.Image
	}).SubImage(r))
}

func TestFiguresFromResults(t *testing.T) {
	cases := []struct {
		name  string
		kind  Kind
		files []string
		w, h  int
		// Regions (fractions of width and height) that must have ink: the
		// panels and legends.
		regions [][4]float64
	}{
		{"passkey-v1.png", KindAuto, []string{"2026-12-01-passkey/v1.jsonl"}, 1850, 800,
			[][4]float64{{0.05, 0.1, 0.3, 0.9}, {0.33, 0.1, 0.42, 0.5}, {0.45, 0.1, 0.9, 0.5}, {0.45, 0.55, 0.9, 0.95}, {0.92, 0.1, 1, 0.4}}},
		{"passkey-v2-8k.png", KindPasskey, []string{"2026-12-01-passkey/v2_8k.jsonl"}, 1850, 620,
			[][4]float64{{0.05, 0.1, 0.3, 0.9}, {0.33, 0.1, 0.42, 0.5}, {0.45, 0.1, 0.9, 0.9}, {0.92, 0.1, 1, 0.4}}},
		{"passkey-base.png", KindAuto, []string{"2026-12-01-passkey/base.jsonl"}, 1270, 620, nil},
		{"passkey-v2-both.png", KindAuto, []string{"2026-12-01-passkey/v2_8k.jsonl", "2026-12-01-passkey/v2_32k.jsonl"}, 1856, 800, nil},
		{"collective-cpu.png", KindAuto, []string{"2026-12-06-collective-plot-cpu.jsonl"}, 2010, 510,
			[][4]float64{{0.05, 0.1, 0.28, 0.9}, {0.33, 0.1, 0.56, 0.9}, {0.62, 0.1, 0.84, 0.9}, {0.85, 0.1, 1, 0.5}}},
		{"attention-h200.png", KindAuto, []string{"2026-11-29-attention-h200-mma.jsonl"}, 1790, 890,
			[][4]float64{{0.02, 0.1, 0.3, 0.5}, {0.3, 0.1, 0.6, 0.5}, {0.6, 0.1, 0.85, 0.5}, {0.02, 0.55, 0.3, 0.95}, {0.88, 0.1, 1, 0.3}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var paths []string
			for _, f := range c.files {
				paths = append(paths, filepath.Join(results, f))
			}
			d := readFiles(t, c.kind, paths...)
			fig, img := render(t, d, c.name)
			if b := img.Bounds(); b.Dx() != c.w || b.Dy() != c.h || fig.Width != c.w || fig.Height != c.h {
				t.Errorf("image %v, figure %dx%d, want %dx%d", b, fig.Width, fig.Height, c.w, c.h)
			}
			if f := inked(img); f < 0.02 || f > 0.5 {
				t.Errorf("%.3f of the pixels are not white: blank or smeared", f)
			}
			for _, r := range c.regions {
				if f := inkedIn(img, r[0], r[1], r[2], r[3]); f < 0.005 {
					t.Errorf("region %v is blank (%.4f inked)", r, f)
				}
			}
		})
	}
}

// TestPasskeyOffsets: records of one length at several in-page offsets
// (--task reversal) get a recall row each.
func TestPasskeyOffsets(t *testing.T) {
	base := readFiles(t, KindPasskey, filepath.Join(results, "2026-12-01-passkey/v2_8k.jsonl"))
	d := &Data{Kind: KindPasskey}
	for _, o := range []string{"start", "middle", "end"} {
		for _, r := range base.Passkey {
			r.Task, r.Offset = "reversal", o
			d.Passkey = append(d.Passkey, r)
		}
	}
	fig, img := render(t, d, "passkey-offsets.png")
	// The legend's long entries ("dense, offset middle (1.000)") widen
	// the figure a little.
	w, h := PasskeySize(3, 3)
	if fig.Width < w || fig.Width > w+100 || fig.Height != h || img.Bounds() != image.Rect(0, 0, fig.Width, fig.Height) {
		t.Errorf("figure %dx%d, image %v, want %dx%d", fig.Width, fig.Height, img.Bounds(), w, h)
	}
}

func TestSizes(t *testing.T) {
	if w, h := PasskeySize(0, 3); w != 810 || h != 620 {
		t.Errorf("PasskeySize(0, 3) = %d, %d", w, h)
	}
	if w, h := PasskeySize(3, 2); w != 810+20+2*290+150 || h != 140+3*330 {
		t.Errorf("PasskeySize(3, 2) = %d, %d", w, h)
	}
	if w, h := AttentionSize(2, 3); w != 230+3*520 || h != 90+2*400 {
		t.Errorf("AttentionSize(2, 3) = %d, %d", w, h)
	}
}

// TestPasskeyWithoutDiagnostics: no mass recall gives the accuracy panel
// alone, at its own size.
func TestPasskeyWithoutDiagnostics(t *testing.T) {
	in := `{"length":2048,"selector":"dense","budget":0,"n":4,"accuracy":1,"dense_accuracy":1}
{"length":2048,"selector":"quest","budget":64,"n":4,"accuracy":0.5,"dense_accuracy":1}
{"length":2048,"selector":"quest","budget":128,"n":4,"accuracy":0.75,"dense_accuracy":1}
`
	d := &Data{}
	if err := d.Read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	fig, img := render(t, d, "passkey-nodiag.png")
	if b := img.Bounds(); b.Dx() != 810 || b.Dy() != 620 || fig.Width != 810 {
		t.Errorf("image %v", b)
	}
	if f := inkedIn(img, 0.05, 0.1, 0.7, 0.9); f < 0.005 {
		t.Errorf("accuracy panel blank (%.4f)", f)
	}
}

// TestOneBudgetOneContext: degenerate axes (one budget, one context) still
// draw.
func TestOneBudgetOneContext(t *testing.T) {
	for _, in := range []string{
		`{"length":512,"selector":"recent","budget":64,"n":1,"accuracy":0,"dense_accuracy":1}`,
		`{"context":4096,"batch":1,"budget":256,"dense_us":12.5,"quest_us":3}`,
	} {
		d := &Data{}
		if err := d.Read(strings.NewReader(in)); err != nil {
			t.Fatal(err)
		}
		if _, img := render(t, d, "degenerate-"+string(d.Kind)+".png"); inked(img) < 0.01 {
			t.Errorf("%s: blank", in)
		}
	}
}

func TestReadErrors(t *testing.T) {
	cases := []struct {
		kind Kind
		in   string
		want string
	}{
		{KindAuto, "", "no JSON lines"},
		{KindAuto, "\n  \n", "no JSON lines"},
		{KindAuto, `{"length":2048,"selector":"dense","budget":0,"accuracy":1}` + "\nnot json\n", "line 2: not a JSON object"},
		{KindAuto, `[1,2]`, "line 1: not a JSON object"},
		{KindAuto, `{"hello":1}`, "line 1: neither"},
		{KindAttention, `{"length":2048,"selector":"dense","budget":0,"accuracy":1}`, "line 1: eval passkey line where bench attention lines are wanted"},
		{KindAuto, `{"length":2048,"selector":"dense","budget":0,"accuracy":1}` + "\n" + `{"context":4096,"dense_us":3}`, "line 2: bench attention line where eval passkey lines are wanted"},
		{KindAuto, `{"length":2048,"selector":"quest","budget":0,"accuracy":1}`, "line 1: selector quest with budget 0"},
		{KindAuto, `{"length":-1,"selector":"quest","budget":64,"accuracy":1}`, "line 1: length -1"},
		{KindAuto, `{"length":2048,"selector":"quest","budget":64,"accuracy":1.5}`, "line 1: accuracy 1.5"},
		{KindAuto, `{"length":"x","selector":"quest","budget":64,"accuracy":1}`, "line 1: passkey line: json"},
		{KindAuto, `{"selector":"quest","accuracy":1}`, "line 1: passkey line without length"},
		{KindAuto, `{"context":0,"dense_us":3}`, "line 1: context 0"},
		{KindAuto, `{"context":4096,"dense_us":"fast"}`, "line 1: attention line: json"},
		{KindAuto, `{"kind":"allgather_sweep","shards":2,"bytes":0,"p50_us":3}`, "line 1: allgather_sweep line: bytes 0"},
		{KindAuto, `{"kind":"allgather_sweep","shards":2,"bytes":1024,"p50_us":-3}`, "line 1: allgather_sweep line"},
		{KindAuto, `{"kind":"collective","shards":0,"batch":1,"select_p50_us":3}`, "line 1: collective line: ranks 0"},
		{KindAuto, `{"kind":"collective","shards":"two"}`, "line 1: collective line: json"},
		{KindCollective, `{"context":4096,"dense_us":3}`, "line 1: bench attention line where bench collective lines are wanted"},
		{KindAuto, `{"kind":"pie"}`, "line 1: neither"},
	}
	for _, c := range cases {
		d := &Data{Kind: c.kind}
		err := d.Read(strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.in, err, c.want)
		}
	}
	if err := (&Data{}).Read(strings.NewReader("")); !errors.Is(err, ErrNoRecords) {
		t.Errorf("empty input: %v, want ErrNoRecords", err)
	}
}

func TestFigureErrors(t *testing.T) {
	if _, err := Passkey(nil); !errors.Is(err, ErrNoRecords) {
		t.Errorf("Passkey(nil): %v", err)
	}
	if _, err := Attention(nil); !errors.Is(err, ErrNoRecords) {
		t.Errorf("Attention(nil): %v", err)
	}
	if _, err := Collective(nil, nil); !errors.Is(err, ErrNoRecords) {
		t.Errorf("Collective(nil, nil): %v", err)
	}
	// Only configurations: one panel, the selection exchange's.
	one, err := Collective(nil, []CollectiveRow{{Transport: "inproc", Shards: 2, Batch: 1, SelectP50: 20, BaselineP50: 5}, {Transport: "inproc", Shards: 4, Batch: 1, SelectP50: 40, BaselineP50: 9}})
	if err != nil {
		t.Fatal(err)
	}
	if w, _ := CollectiveSize(1); one.Width != w {
		t.Errorf("configurations only: %d pixels wide, want one panel's %d", one.Width, w)
	}
	if _, err := (&Data{}).Figure(); !errors.Is(err, ErrNoRecords) {
		t.Errorf("empty Data: %v", err)
	}
	d := &Data{}
	if err := d.Read(strings.NewReader(`{"length":2048,"selector":"dense","budget":0,"accuracy":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Figure(); err == nil || !strings.Contains(err.Error(), "only dense") {
		t.Errorf("dense only: %v", err)
	}
	d = &Data{}
	if err := d.Read(strings.NewReader(`{"context":4096,"dense_us":0}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Figure(); err == nil || !strings.Contains(err.Error(), "no positive timing") {
		t.Errorf("zero timings: %v", err)
	}
}

func TestParseKind(t *testing.T) {
	for _, s := range []string{"auto", "passkey", "attention", "collective"} {
		if k, err := ParseKind(s); err != nil || string(k) != s {
			t.Errorf("ParseKind(%q) = %q, %v", s, k, err)
		}
	}
	if _, err := ParseKind("pie"); err == nil {
		t.Error("ParseKind(pie) succeeded")
	}
}

// FuzzRead: any input either fails to read or reads into records whose
// figure either fails cleanly or draws.
func FuzzRead(f *testing.F) {
	f.Add(`{"length":2048,"selector":"quest","budget":64,"n":1,"accuracy":0.5,"dense_accuracy":1,"teacher_forced":{"layers":[{"layer":0,"mass_recall":0.5}]}}`)
	f.Add(`{"context":4096,"batch":1,"budget":256,"dense_us":12.5,"quest_us":3,"score_us":1}`)
	f.Add("{}\n\n{\"selector\":1}")
	f.Fuzz(func(t *testing.T, in string) {
		d := &Data{}
		if d.Read(strings.NewReader(in)) != nil {
			return
		}
		fig, err := d.Figure()
		if err != nil {
			return
		}
		if fig.Width <= 0 || fig.Height <= 0 || fig.Width > 20000 || fig.Height > 20000 {
			t.Fatalf("figure %dx%d", fig.Width, fig.Height)
		}
	})
}
