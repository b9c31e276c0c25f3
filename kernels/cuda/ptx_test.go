package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// TestPTXMatchesSource fails when a .cu changed without running gen.sh.
func TestPTXMatchesSource(t *testing.T) {
	for _, c := range []struct {
		name, src, ptx string
		kernels        []string
	}{
		{"quest", source, PTX, []string{"quest_topk", "quest_reduce", "quest_merge", "quest_score_bf16", "quest_attend_f16", "quest_append_f32", "quest_convert_bf16"}},
		{"slots", sourceSlots, PTXSlots, []string{"quest_slots_move", "quest_append_slots_bf16", "quest_rescan_slots_f32"}},
		{"mma", sourceMMA, PTXMMA, []string{"quest_scoremma_bf16_d128", "quest_scoremma_f16_d64_h16", "quest_attendmma_bf16_d128", "quest_attendmma_f16_d64_h16"}},
	} {
		sum := sha256.Sum256([]byte(c.src))
		want := hex.EncodeToString(sum[:])
		if got := PTXSourceHash(c.ptx); got != want {
			t.Errorf("%s.ptx was built from source %q, %s.cu is %q: run kernels/cuda/gen.sh", c.name, got, c.name, want)
		}
		for _, fn := range c.kernels {
			if !strings.Contains(c.ptx, ".entry "+fn+"(") {
				t.Errorf("%s.ptx lacks kernel %s", c.name, fn)
			}
		}
		if !strings.Contains(c.ptx, ".target sm_90") {
			t.Errorf("%s.ptx is not for sm_90", c.name)
		}
	}
}
