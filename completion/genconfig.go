package completion

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Sampling is a checkpoint's default sampling (generation_config.json's
// temperature and top_p), applied to the requests that leave them out, as
// vLLM applies them; nil fields keep OpenAI's defaults (1 and 1).
type Sampling struct {
	Temperature *float64
	TopP        *float64
	// EOS are generation_config.json's eos_token_id (one id or a list):
	// they end every completion as config.json's EOS does, as vLLM adds
	// them to the stop tokens. Instruct checkpoints list their end of
	// turn there (Llama 3's <|eot_id|>) when config.json names only the
	// end of text.
	EOS []int
}

// zero says that s holds nothing (no generation_config.json read).
func (s Sampling) zero() bool { return s.Temperature == nil && s.TopP == nil && s.EOS == nil }

// LoadSampling reads dir's generation_config.json: its temperature and
// top_p when do_sample is not false (do_sample false: greedy, temperature
// 0). A checkpoint without the file has none; values outside the API's
// ranges (temperature 0..2, top_p 0..1) are an error naming the file.
func LoadSampling(dir string) (Sampling, error) {
	path := filepath.Join(dir, "generation_config.json")
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Sampling{}, nil
	}
	if err != nil {
		return Sampling{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return Sampling{}, fmt.Errorf("%s: %w", path, err)
	}
	var g struct {
		DoSample    *bool           `json:"do_sample"`
		Temperature *float64        `json:"temperature"`
		TopP        *float64        `json:"top_p"`
		EOS         json.RawMessage `json:"eos_token_id"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		return Sampling{}, fmt.Errorf("%s: %w", path, err)
	}
	var eos []int
	if len(g.EOS) > 0 && string(g.EOS) != "null" {
		var one int
		if json.Unmarshal(g.EOS, &one) == nil {
			eos = []int{one}
		} else if err := json.Unmarshal(g.EOS, &eos); err != nil {
			return Sampling{}, fmt.Errorf("%s: eos_token_id %s: want a token id or a list of them", path, g.EOS)
		}
		for _, id := range eos {
			if id < 0 {
				return Sampling{}, fmt.Errorf("%s: eos_token_id %d is negative", path, id)
			}
		}
	}
	if g.DoSample != nil && !*g.DoSample {
		zero := 0.0
		return Sampling{Temperature: &zero, EOS: eos}, nil
	}
	if t := g.Temperature; t != nil && !(*t >= 0 && *t <= 2) {
		return Sampling{}, fmt.Errorf("%s: temperature %v outside 0..2", path, *t)
	}
	if p := g.TopP; p != nil && !(*p >= 0 && *p <= 1) {
		return Sampling{}, fmt.Errorf("%s: top_p %v outside 0..1", path, *p)
	}
	return Sampling{Temperature: g.Temperature, TopP: g.TopP, EOS: eos}, nil
}
