// Package serve is questrt's OpenAI-compatible completions API: an
// [http.Handler] over one model (package model, on the CPU) whose KV
// pages live in an in-process engine (package engine) with Quest page
// selection.
//
// # API
//
//   - POST /v1/completions: OpenAI's legacy completions request (model,
//     prompt as a string or an array of token ids, max_tokens, temperature,
//     top_p, seed, stop, stream, stream_options, n = 1) plus a "quest" object
//     choosing the request's page budget, selector and dense layers
//     ([QuestOptions]). The answer is OpenAI's text_completion object, or
//     with "stream": true server-sent events of completion chunks ending in
//     "data: [DONE]"; usage is extended with the pages decode steps read,
//     the pages dense attention would have read, and the bytes read over
//     dense attention's (rho, computed as questctl generate does).
//   - GET /v1/models and GET /v1/models/{id}: the one model.
//
// Every error is OpenAI's JSON error object ({"error": {"message",
// "type", "param", "code"}}, see [ErrorBody]): 400 for bad parameters
// (strict decoding: unknown fields and wrong types are refused, with the
// field named in "param"), 404 for an unknown model or path, 405 for a
// wrong method, 413 for a body over [Config.MaxBodyBytes], 429 with
// Retry-After when admission refuses, 503 while draining or closing,
// 504 past [Config.RequestTimeout].
//
// # Scheduling
//
// One scheduler goroutine, owned by the [Server] (started by [New],
// stopped by [Server.Close]), runs everything that touches the model and
// the engine, in iterations. At each iteration boundary admitted
// requests join (up to [Config.MaxRunning] at once) and finished,
// cancelled or timed-out ones leave, releasing their sequence. Each
// iteration then prefills up to [Config.ChunkTokens] prompt tokens
// (chunks of the prefilling requests, shortest remaining prompt first,
// into a dense float32
// recorder whose keys and values are loaded into the engine when the
// prompt is done) and runs one decode step for every decoding request
// together: [model.Model.DecodeBatch], the matrix products over the
// batch, attention per sequence through the engine. A long prompt so
// takes several iterations and never stalls the requests that decode
// meanwhile.
//
// Admission is all or nothing: a request is admitted only when the pages
// its prompt and max_tokens can fill fit the engine's pool next to the
// pages every admitted request has reserved, and when the running and
// queued requests are under their caps; otherwise it gets 429 with
// Retry-After and nothing changes. An admitted request therefore never
// runs out of pages.
package serve
