package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// TestPTXMatchesSource fails when quest.cu changed without running gen.sh.
func TestPTXMatchesSource(t *testing.T) {
	sum := sha256.Sum256([]byte(source))
	want := hex.EncodeToString(sum[:])
	if got := PTXSourceHash(); got != want {
		t.Fatalf("quest.ptx was built from source %q, quest.cu is %q: run kernels/cuda/gen.sh", got, want)
	}
	for _, fn := range []string{"quest_topk", "quest_reduce", "quest_merge", "quest_score_bf16", "quest_attend_f16", "quest_append_f32", "quest_convert_bf16"} {
		if !strings.Contains(PTX, ".entry "+fn+"(") {
			t.Errorf("PTX lacks kernel %s", fn)
		}
	}
	if !strings.Contains(PTX, ".target sm_90") {
		t.Error("PTX is not for sm_90")
	}
}
