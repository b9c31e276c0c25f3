package serve

import (
	"os"
	"path/filepath"
	"testing"
)

// TestLoadSampling: generation_config.json's temperature and top_p, greedy
// for do_sample false, none without the file, refusals outside the API's
// ranges.
func TestLoadSampling(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		name, body string
		temp, top  *float64
		wantErr    bool
		noFile     bool
	}{
		{name: "no file", noFile: true},
		{name: "values", body: `{"temperature": 0.6, "top_p": 0.9, "bos_token_id": 1}`, temp: f(0.6), top: f(0.9)},
		{name: "do_sample false", body: `{"do_sample": false, "temperature": 0.6}`, temp: f(0)},
		{name: "temperature only", body: `{"temperature": 0.7}`, temp: f(0.7)},
		{name: "temperature too high", body: `{"temperature": 3}`, wantErr: true},
		{name: "top_p too high", body: `{"top_p": 1.5}`, wantErr: true},
		{name: "not JSON", body: `{`, wantErr: true},
	} {
		dir := t.TempDir()
		if !c.noFile {
			if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(c.body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := LoadSampling(dir)
		if (err != nil) != c.wantErr {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		eq := func(a, b *float64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
		if !eq(got.Temperature, c.temp) || !eq(got.TopP, c.top) {
			t.Errorf("%s: %+v", c.name, got)
		}
	}
}

// TestSamplingDefaults: a request without temperature or top_p takes the
// checkpoint's; one that gives them keeps its own.
func TestSamplingDefaults(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	zero, top := 0.0, 0.8
	cfg.Sampling = Sampling{Temperature: &zero, TopP: &top}
	s, _ := startServer(t, m, tok, cfg)
	p, err := s.resolve(&CompletionRequest{Model: "tiny", Prompt: &Prompt{Text: "x"}})
	if err != nil || p.temperature != 0 || p.topP != 0.8 {
		t.Errorf("defaults: temperature %v top_p %v (%v), want 0 and 0.8", p.temperature, p.topP, err)
	}
	one, half := 1.0, 0.5
	p, err = s.resolve(&CompletionRequest{Model: "tiny", Prompt: &Prompt{Text: "x"}, Temperature: &one, TopP: &half})
	if err != nil || p.temperature != 1 || p.topP != 0.5 {
		t.Errorf("the request's own: temperature %v top_p %v (%v), want 1 and 0.5", p.temperature, p.topP, err)
	}
}
