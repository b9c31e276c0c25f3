package completion

import "testing"

// BenchmarkPrefixCacheTTFT is benchPrefixTTFT in the local layout: one
// server with a pool of 4,096 pages.
func BenchmarkPrefixCacheTTFT(b *testing.B) {
	benchPrefixTTFT(b, func(_ *testing.B, _ int, cfg *Config) { cfg.CapacityPages = 4096 })
}
