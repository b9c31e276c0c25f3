package completion

import (
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestServeOnDeviceFP8Host: the host side of questd --serve-layout
// device --kv-cache-dtype fp8 on the CPU twin of a device: a server of
// fp8 pages (KVDType) with device-resident engines, the device
// executor's decoder and its prefiller, admits, prefills every prompt
// token on the device and decodes. The twin's device pools are the CPU
// backend's, which hold f32 whatever the grid's type (the storage type
// of device pools is the backend's: kernels.SlotStore.PoolDType, fp8 on
// cuda.New(DType: plan.FP8)), so its texts are the CPU f32 server's:
// the fp8 records themselves are only read on a GPU
// (model/gpu TestGreedyPrefillMatchesCPU "fp8 pages").
func TestServeOnDeviceFP8Host(t *testing.T) {
	tw := prefillTwin(t, func(c *Config) { c.KVDType = plan.FP8 })
	dev, cpuTS, devTS, pf := tw.dev, tw.cpuTS, tw.devTS, tw.pf
	prompt := 0
	for _, p := range []string{"the quick brown fox jumps over the lazy dog, again and again and again", "0123456789 ", "a"} {
		r := map[string]any{"model": "tiny", "prompt": p, "max_tokens": 10, "temperature": 0}
		got := complete(t, devTS.URL, r)
		if want := complete(t, cpuTS.URL, r).Choices[0].Text; got.Choices[0].Text != want {
			t.Errorf("%q: device %q, CPU %q", p, got.Choices[0].Text, want)
		}
		prompt += got.Usage.PromptTokens - got.Usage.PromptTokensDetails.CachedTokens
	}
	if pf.tokens != prompt || dev.Queued() == 0 {
		t.Errorf("the device prefilled %d of %d prompt tokens and queued %d steps", pf.tokens, prompt, dev.Queued())
	}
}
