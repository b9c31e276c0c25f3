// Package completion is questrt's OpenAI-compatible completions and chat
// completions API: an
// [http.Handler] over one model (package model, on the CPU) whose KV
// pages live in an in-process engine (package engine) with Quest page
// selection, or on a cluster's workers ([Config.Cluster]).
//
// # Layouts
//
// By default every request's sequence is laid out over the CP x TP
// shards of an in-process engine ([Config.CP], [Config.TP]). With
// [Config.Cluster] (a node's coordinator: internal/serveengine, as
// questd --serve-layout cluster wires it) the model still runs in this
// process, but each request's sequence is created through the
// coordinator on a CP x TP grid of the cluster's nodes (rank (0, 0) on
// the coordinator's node when it has room, the others spread over the
// other nodes): the prompt's keys and values are appended to the
// grid's workers, and every decode step of a layer is one coordinator
// step (the plan and the query to the workers, the merged partial
// states back). Scheduling, admission (the pages per shard of the
// grid's ranks), cancellation, usage, the quality monitor (forks on the
// grid) and the history work the same way; a request whose grid cannot
// be placed or loses a node gets 503 with Retry-After. The layout is
// the server's: a request cannot choose its own grid.
//
// # API
//
//   - POST /v1/completions: OpenAI's legacy completions request (model,
//     prompt as a string, an array of token ids or a batch of either,
//     max_tokens, temperature, top_p, seed, stop, logprobs, echo, stream,
//     stream_options, n; vLLM's top_k, min_p, stop_token_ids and
//     truncate_prompt_tokens)
//     plus a "quest" object
//     choosing the request's page budget, selector and dense layers
//     ([QuestOptions]). The answer is OpenAI's text_completion object, or
//     with "stream": true server-sent events of completion chunks ending in
//     "data: [DONE]"; usage is extended with the pages decode steps read,
//     the pages dense attention would have read, and the bytes read over
//     dense attention's (rho, computed as questctl generate does).
//   - POST /v1/chat/completions: OpenAI's chat completions request
//     (messages of text, max_tokens or max_completion_tokens, and the
//     rest as for completions; vLLM's add_generation_prompt,
//     continue_final_message and chat_template_kwargs; [ChatRequest]):
//     the messages rendered with
//     [Config.ChatTemplate] (package chat) are the prompt. The answer is a
//     chat.completion object, or chat.completion.chunk events (the
//     assistant's role first) ending in "data: [DONE]".
//   - GET /v1/models and GET /v1/models/{id}: the one model.
//   - POST /tokenize and POST /detokenize (vLLM's): a prompt's or a
//     chat's ids as they would be prefilled, with max_model_len (and
//     with return_token_strs each token's text), and the text of ids;
//     nothing runs. Every endpoint takes a request without a model as
//     one for the server's model, as vLLM does.
//   - GET /health: 200 with an empty body while the server admits
//     requests, 503 while it drains or after Close (as vLLM's).
//   - GET /admin/requests, GET /admin/requests/{id} and POST
//     /admin/requests/{id}/replay: the last [Config.History] finished
//     requests by completion id (prompt and output tokens, settings;
//     [RequestRecord]) and a request's dense replay, teacher-forced on
//     its tokens, which says per token whether dense attention picks
//     the same token and where the two first diverge ([ReplayReport];
//     questctl replay-request).
//
// Every error is OpenAI's JSON error object ({"error": {"message",
// "type", "param", "code"}}, see [ErrorBody]): 400 for bad parameters
// (known fields are decoded strictly: wrong types and values are
// refused, with the field named in "param"; unknown fields are ignored,
// as vLLM does, named in the answer's [IgnoredFieldsHeader] and logged
// once per name), 404 for an unknown model or path, 405 for a
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
// into a dense float32 recorder whose keys and values are loaded into
// the engine when the prompt is done) and runs one decode step for every
// request that was decoding as it began, together:
// [model.Model.DecodeBatch], the matrix products over the batch,
// attention per sequence through the engine. [Config.MaxBatchedTokens]
// (vLLM's max_num_batched_tokens) bounds the iteration's tokens: the
// decode rows first, the prompt tokens get the rest. A long prompt so
// takes several iterations and never stalls the requests that decode
// meanwhile; a lower budget keeps their inter-token latency closer to a
// decode step's and prefills it in more iterations.
//
// A request's quest object may choose any selector (quest, oracle,
// recent, dense), GQA mode, sink and local pages, budget and dense
// layers. Budget, dense layers and the dense selector are per step on
// the server's engine; a selector, GQA mode, sink or local pages other
// than the engine's put the request's sequence on an engine of its own
// (its policy, a pool of the pages its admission reserved; on a
// cluster, the grid of its policy, shared with the requests of the same
// options, which stays open: [Config.PolicyGrids] bounds those grids and
// a request whose options would open one more gets 429), still in the
// same decode batch: DecodeBatch runs each sequence's attention on
// its own engine sequence, so no grouping by options is needed.
//
// # Quality monitor
//
// With [MonitorConfig.Rate] > 0 a fraction of the decode steps'
// (layer, KV head) pairs is replayed with the engine's dense
// diagnostics on a fork of the sequence, off the requests' path, by one
// monitor goroutine behind a bounded queue (full: dropped and counted);
// each replay yields a [MonitorSample] (page recall, attention-mass
// recall, output error) for the caller's metrics.
//
// # Choices
//
// A request of n choices per prompt (n 1..[MaxChoices]; a completion's
// prompt may be a batch of prompts, its choices indexed prompt-major:
// index = prompt*n + choice, as OpenAI does) runs as one job per choice,
// each a sequence with a sampler of its own: with a seed, choice i
// samples with seed + i, so that it equals a request of n = 1 with that
// seed (without one, the server's seed of the request plus i). Each
// prompt is prefilled once, by its first choice; when the prompt is
// done its sequence is forked (model.EngineAttention.Fork: sealed pages
// shared, the tail copied on write; a cluster's coordinator forks on
// the grid) for the other choices, which sample their first token from
// the same logits. A choice after the first reserves only the pages a
// fork adds (its tail page and the pages after it); a request's
// reservation is released when its last choice ends. The usage counts
// each prompt once and every choice's tokens and pages; a stream's
// chunks carry their choice's index, each choice ends with its own
// finish chunk, and the usage chunk and [DONE] follow the last.
//
// Admission is all or nothing: a request is admitted into the queue
// when its sequences (a choice is one) fit under the running and queued
// caps; otherwise it gets 429 with Retry-After, naming questd
// --max-queued, and nothing changes (a request that could never fit the
// pool or the caps gets 400 naming n, or prompt). Queued requests start
// in admission order, each when the pages it reserves fit the engine's
// pool next to the pages the running requests have reserved: a request
// that does not fit now waits in the queue (bounded by the request
// timeout) until running ones end, and the requests behind it wait too,
// so none is overtaken for ever. By default ([Config.GrowReservations],
// as vLLM) a request of one sequence reserves the pages of its prompt
// and next token when it starts and a page more as its decode steps
// open one; when the pool has none left, the newest running request is
// preempted (its pages back to the pool, it waits at the front of the
// queue and runs again from its prompt and the tokens it had generated,
// with the same greedy tokens), so a request never gives its pages to
// a newer one and the pool cannot deadlock. Requests of several sequences (n, a batch of
// prompts), of their own selection options, on a cluster, and every
// request with GrowReservations off reserve the pages their prompts and
// max_tokens can fill when they start, and so never run out of pages.
// On a cluster ([Config.Cluster]) a request's sequence is created, at
// its turn to prefill, on a goroutine of its own (a grid opening may
// take seconds) that hands it to the scheduler at an iteration
// boundary; the running requests go on decoding meanwhile. A cluster
// that cannot hold the request's grid answers it with 503.
package completion
