// Package offload is the benchmark behind `questctl bench offload`: one
// sequence, one layer, one Quest step per query, first on a shard that
// holds every page (the all-resident step), then on offloading shards
// (a device budget of pages, the others in a tier: host memory, slab
// files, or host memory spilling to them) stepped with the same queries,
// with prefetch on or off. Each configuration's result reports the step
// time next to the all-resident one, the time stalled in recalls, the
// hit rate, the bytes moved each way and the largest difference to the
// all-resident outputs (0 when recall is exact). Config validates the
// settings and Preflight checks their memory before anything is
// allocated; the CLI keeps the flags, the table and the JSON lines.
package offload
