package serveload

// Result is one JSON line: one (selector, concurrency) level,
// alone or (background_prompt_len > 0) while one long prompt is prefilled.
type Result struct {
	Selector    string `json:"selector"`
	Concurrency int    `json:"concurrency"`
	Requests    int    `json:"requests"`
	Completed   int    `json:"completed"`
	Errors      int    `json:"errors"`
	// Retries429 counts the answers 429 (admission refused) that were
	// retried after their Retry-After.
	Retries429 int `json:"retries_429"`
	// PromptLen is the prompts' nominal bytes; PromptTokens the mean
	// prompt tokens the server counted.
	PromptLen    int     `json:"prompt_len"`
	PromptTokens float64 `json:"prompt_tokens"`
	// CachedTokens is the mean prompt tokens the server took from its
	// prefix cache (usage.prompt_tokens_details.cached_tokens): requests
	// repeat their prompts across levels and selectors, so with the
	// server's prefix cache on (questd's default) later levels prefill
	// less; questd --prefix-caching=false times every prefill.
	CachedTokens float64 `json:"cached_tokens"`
	MaxTokens    int     `json:"max_tokens"`
	Budget       int     `json:"budget"`
	// Time to first token: from sending the request to the first chunk of
	// text; inter-token latency: the gaps between chunks after it (a chunk
	// of k bytes is k tokens, each 1/k of its gap); TPOT: a request's
	// (last chunk - first chunk) / (tokens - 1), mean over requests; E2E:
	// from sending to the end of the stream.
	TTFTP50MS  float64 `json:"ttft_p50_ms"`
	TTFTP99MS  float64 `json:"ttft_p99_ms"`
	TTFTMeanMS float64 `json:"ttft_mean_ms"`
	ITLP50MS   float64 `json:"itl_p50_ms"`
	ITLP99MS   float64 `json:"itl_p99_ms"`
	TPOTMeanMS float64 `json:"tpot_mean_ms"`
	E2EP50MS   float64 `json:"e2e_p50_ms"`
	E2EP99MS   float64 `json:"e2e_p99_ms"`
	// OutputTokens is the completion tokens of the level's requests (the
	// server's usage); OutputTokensPerS them over WallS, the time from the
	// level's first request sent to its last stream's end.
	OutputTokens     int     `json:"output_tokens"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	RequestsPerS     float64 `json:"requests_per_s"`
	WallS            float64 `json:"wall_s"`
	// Correct counts the completions that start with the passkey.
	Correct  int     `json:"correct"`
	Accuracy float64 `json:"accuracy"`
	// BytesReadVsDense is the mean of the server's usage.bytes_read_vs_dense.
	BytesReadVsDense float64 `json:"bytes_read_vs_dense"`
	// With a background prompt: its time to first token (its prefill),
	// the requests of the level sent before it (during its prefill), their
	// time to first token, and its median over the median of the same
	// level alone (the line before).
	BackgroundPromptLen    int     `json:"background_prompt_len"`
	BackgroundTTFTMS       float64 `json:"background_ttft_ms"`
	DuringPrefill          int     `json:"during_prefill"`
	TTFTDuringPrefillP50MS float64 `json:"ttft_during_prefill_p50_ms"`
	TTFTDuringPrefillMaxMS float64 `json:"ttft_during_prefill_max_ms"`
	TTFTVsAlone            float64 `json:"ttft_vs_alone"`
	// LoadAvg1 is this machine's 1-minute load average as the level
	// started (/proc/loadavg; -1 where there is none).
	LoadAvg1 float64 `json:"loadavg_1m"`
	// The shared-prefix workload (--shared-prefix-len): each level's
	// requests share PrefixGroups documents of SharedPrefixLen bytes
	// (request i the document i mod PrefixGroups, new ones each level),
	// each followed by its own short question. Hits counts the requests
	// the server's prefix cache served (cached_tokens above 0); the TTFT
	// of those and of the others (misses: a document's first request, or
	// every request with questd --prefix-caching=false); CachedTokensPerRequest
	// is each request's cached_tokens, in request order (-1: failed).
	SharedPrefixLen        int     `json:"shared_prefix_len,omitempty"`
	PrefixGroups           int     `json:"prefix_groups,omitempty"`
	Hits                   int     `json:"hits"`
	TTFTHitP50MS           float64 `json:"ttft_hit_p50_ms"`
	TTFTHitMeanMS          float64 `json:"ttft_hit_mean_ms"`
	TTFTMissP50MS          float64 `json:"ttft_miss_p50_ms"`
	TTFTMissMeanMS         float64 `json:"ttft_miss_mean_ms"`
	CachedTokensPerRequest []int   `json:"cached_tokens_per_request,omitempty"`
}
