// Package serveload is the load test behind `questctl bench serve`: it
// sends passkey prompts (eval.Passkey) as streaming completions to a
// running completions API (package completion, as questd serves it), level
// by level (a number of requests in flight, a selector), and measures
// each level's time to first token, inter-token latency, throughput and
// passkey accuracy; optionally while one long prompt is prefilled in
// the background (chunked prefill), or with requests that share
// documents (the prefix cache's hits and misses). Config validates the
// settings; the CLI keeps the flags, the credentials, the table and the
// JSON lines.
package serveload
