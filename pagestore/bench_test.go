package pagestore

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/questrt/questrt/plan"
)

// BenchmarkPrefillAppend appends 4096-token prefill chunks (D = 128, 8 KV
// heads, S = 16, one layer): K/V copy plus incremental min/max. Bytes are the
// K+V bytes written. The persist=periodic runs add a data directory
// (SyncPeriodic, no flush inside the timed loop): the
// append path's own persistence cost is the length record written at
// every append.
func BenchmarkPrefillAppend(b *testing.B) {
	for _, persist := range []string{"none", "periodic"} {
		for _, chunk := range []int{4096, 1} {
			name := fmt.Sprintf("chunk=%d", chunk)
			if persist != "none" {
				name = fmt.Sprintf("persist=%s/chunk=%d", persist, chunk)
			}
			b.Run(name, func(b *testing.B) { benchPrefillAppend(b, chunk, persist != "none") })
		}
	}
}

func benchPrefillAppend(b *testing.B, chunk int, persist bool) {
	const H, D, S = 8, 128, 16
	const total = 4096 // tokens per sequence before it is recycled
	cfg := Config{Layers: 1, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: total / S}
	if persist {
		cfg.DataDir, cfg.Durability, cfg.SyncInterval = b.TempDir(), SyncPeriodic, time.Hour
	}
	s := mustStore(b, cfg)
	k, v := randKV(rand.New(rand.NewPCG(1, 1)), chunk, H*D)
	bytes := int64(2 * chunk * H * D * 4)
	b.SetBytes(bytes)
	id := s.Create()
	used := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if used+chunk > total {
			if err := s.Release(id); err != nil {
				b.Fatal(err)
			}
			id, used = s.Create(), 0
		}
		if err := s.Append(id, 0, k, v); err != nil {
			b.Fatal(err)
		}
		used += chunk
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N*chunk)/sec, "tokens/s")
	b.ReportMetric(float64(b.N)*float64(bytes)/sec/1e9, "GB/s")
}
