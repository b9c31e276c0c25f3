package offload

// Result is one JSON line: one (context, budget, workload, device
// budget, prefetch) configuration against the all-resident step on the
// same data and queries.
type Result struct {
	Context  int    `json:"context"`
	Budget   int    `json:"budget"`
	Pages    int    `json:"pages"`
	KPages   int    `json:"k_pages"`
	PageSize int    `json:"page_size"`
	QHeads   int    `json:"q_heads"`
	KVHeads  int    `json:"kv_heads"`
	HeadDim  int    `json:"head_dim"`
	Tier     string `json:"tier"`
	Backend  string `json:"backend"`
	Eviction string `json:"eviction"`
	Workload string `json:"workload"`
	// DeviceBudgetPct is the share of the sequence's pages whose K/V stay
	// on the device (DevicePages pages; at least 2).
	DeviceBudgetPct int `json:"device_budget_pct"`
	DevicePages     int `json:"device_pages"`
	Prefetch        int `json:"prefetch"`
	Steps           int `json:"steps"`
	Warmup          int `json:"warmup"`
	// StepUS is the mean wall time of a timed step, StepP50US its median;
	// ResidentStepUS and ResidentP50US the same for the all-resident shard
	// (no offload: the served, fused step) over the same queries.
	StepUS         float64 `json:"step_us"`
	StepP50US      float64 `json:"step_p50_us"`
	ResidentStepUS float64 `json:"resident_step_us"`
	ResidentP50US  float64 `json:"resident_p50_us"`
	Slowdown       float64 `json:"slowdown"`
	// StallUS is the mean time per step inside its recalls: tier reads,
	// write-backs, and waits for prefetch reads in flight.
	StallUS float64 `json:"stall_us"`
	// HitRate is the share of the pages the steps' recalls wanted that
	// were resident (prefetched ones included).
	HitRate       float64 `json:"hit_rate"`
	MissesPerStep float64 `json:"misses_per_step"`
	// H2DBytesPerStep is the payload read from the tier into device slots
	// per step, by the steps and the prefetcher; D2HBytesPerStep what
	// write-backs wrote to the tier.
	H2DBytesPerStep float64 `json:"h2d_bytes_per_step"`
	D2HBytesPerStep float64 `json:"d2h_bytes_per_step"`
	PassesPerStep   float64 `json:"passes_per_step"`
	MultiPassSteps  int64   `json:"multi_pass_steps"`
	// FusedSteps counts the timed steps that found every page resident
	// and ran fused, reading K/V through the device's page -> slot table
	// (shard.OffloadStats.Fused; --backend cuda, no prefetch).
	FusedSteps int64 `json:"fused_steps"`
	// Prefetch counters per step: pages reserved, pages a step found
	// resident only because of a prefetch, prefetched pages that left
	// unused, and the time steps waited for reads in flight.
	PrefetchIssuedPerStep float64 `json:"prefetch_issued_per_step"`
	PrefetchHitsPerStep   float64 `json:"prefetch_hits_per_step"`
	PrefetchWastedPerStep float64 `json:"prefetch_wasted_per_step"`
	PrefetchWaitUS        float64 `json:"prefetch_wait_us"`
	PrefetchPlanUS        float64 `json:"prefetch_plan_us"`
	// MaxAbsDiff is the largest |o - o_resident| over the timed steps'
	// outputs: 0 when every step attended in one pass (recall is exact).
	MaxAbsDiff   float64 `json:"max_abs_diff"`
	BitIdentical bool    `json:"bit_identical"`
	// The fields of SpillResult, with --tier host+disk only.
	*SpillResult
}

// SpillResult is what --tier host+disk adds to a JSON line: the
// host budget of the tier.Spill and its counters.
type SpillResult struct {
	// HostBudgetPct is the share of the sequence's pages whose payloads
	// the host tier may hold (HostPages pages, at least 1); the others
	// spill to the disk tier.
	HostBudgetPct int `json:"host_budget_pct"`
	HostPages     int `json:"host_pages"`
	// HostSlots and DiskSlots are the payloads held by each tier after
	// the timed steps.
	HostSlots int `json:"host_slots"`
	DiskSlots int `json:"disk_slots"`
	// Spills and SpilledBytes count the payloads moved from host to disk
	// over the whole run (fill and warm-up included), SpillErrors the
	// spills that failed; SpillsPerStep those of the timed steps.
	Spills        int64   `json:"spills"`
	SpilledBytes  int64   `json:"spilled_bytes"`
	SpillErrors   int64   `json:"spill_errors"`
	SpillsPerStep float64 `json:"spills_per_step"`
	// HostReadsPerStep and DiskReadsPerStep are the tier reads of a timed
	// step (recalls and prefetches) served by each tier.
	HostReadsPerStep float64 `json:"host_reads_per_step"`
	DiskReadsPerStep float64 `json:"disk_reads_per_step"`
}
