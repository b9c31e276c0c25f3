package engine

import (
	"fmt"

	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// DevicePageBytes returns the device memory of the K/V and summary pools
// of c, the config of one rank (CP 1 x TP 1) with device-resident pages,
// stored as c.Geometry.DType: a device's pools hold K/V and summaries in
// the pages' type (the host store's PoolBytes counts float32); for
// plan.FP8 the device holds the store's own records, one byte per
// element plus a float32 scale per record, and float32 summaries, which
// PoolBytes counts as they are. A config of several ranks is an error:
// split it per rank first (Geometry.Split).
func (c Config) DevicePageBytes() (int64, error) {
	if c.CP*c.TP != 1 {
		return 0, fmt.Errorf("engine: device page memory of %d x %d ranks: give one rank's config", c.CP, c.TP)
	}
	kv, sum, err := pagestore.Config{Layers: c.Layers, Geometry: c.Geometry, Capacity: c.CapacityPages}.PoolBytes()
	if err != nil {
		return 0, fmt.Errorf("engine: %w", err)
	}
	if c.Geometry.DType == plan.FP8 {
		return int64(kv) + int64(sum), nil
	}
	return (int64(kv) + int64(sum)) / 4 * int64(c.Geometry.DType.Bytes()), nil
}
