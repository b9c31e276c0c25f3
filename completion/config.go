package completion

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/questrt/questrt/chat"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// Config describes a Server. DefaultConfig documents the defaults.
type Config struct {
	// ModelName is the model's id in /v1/models and the name requests
	// must give. "": Load takes the checkpoint directory's base name; New
	// requires one.
	ModelName string
	// Policy is the serving policy (plan.DefaultPolicy()): page size,
	// default budget, per-layer budgets, sink, local, GQA mode, selector
	// and dense layers. A request's quest object may change any of them
	// but the page size: a request whose selector, GQA mode, sink or
	// local pages differ from the policy's runs on an engine of its own
	// (see QuestOptions).
	Policy plan.Policy
	// CP and TP are the grid of every request's sequence (1 x 1): the
	// in-process engine's shards, or with Cluster the ranks of the grid
	// the cluster lays the sequence out on. Selection is its CP
	// selection mode (plan.Exact).
	CP, TP    int
	Selection plan.SelectMode
	// Cluster, when set, holds the requests' sequences instead of an
	// in-process engine (nil: the in-process engine, the default): the
	// model runs in this process and every request's sequence is
	// created through Cluster on a CP x TP grid of the cluster's
	// workers (a node's coordinator: internal/serveengine's
	// CoordinatorCluster), where its KV pages live. Batching, admission, cancellation and usage work as
	// with the in-process engine, but memory is bounded differently: a
	// request whose selection options differ from Policy's gets a grid
	// of that policy (shared by the requests of the same options)
	// instead of an engine of its own, and every grid stays open on the
	// cluster's nodes, each of its ranks reserving CapacityPages pages
	// (plus the quality monitor's slack), until the cluster's
	// coordinator closes (it closes no grid that merely runs out of
	// sequences). Admission bounds the pages the requests use within
	// each grid; PolicyGrids bounds the grids, so the nodes reserve at
	// most (1 + PolicyGrids) pools per rank for this server. The
	// scheduler creates a request's sequence off its goroutine (a grid
	// opening takes up to the coordinator's open timeout), so running
	// requests keep decoding meanwhile. The sequences a grid of the
	// server's adopts when it opens on nodes restarted on their data
	// directories (questd --data-dir) are nobody's (the server creates
	// every sequence afresh): the coordinator's Cluster releases them in the
	// Create that opened the grid.
	Cluster Cluster
	// Engines opens the in-process engines (the main one without
	// Cluster, and those of requests with selection options of their
	// own) and checks the grid of the cluster's sequences with Cluster:
	// internal/serveengine.Engines() for the runtime's. Required.
	Engines Engines
	// PolicyGrids bounds, with Cluster, the distinct selection option
	// sets other than Policy's (selector, GQA mode, sink and local
	// pages) that requests may open a grid for (2). Such a grid stays
	// open for the server's life (see Cluster); a request whose options
	// would open one past the bound gets 429 with Retry-After, while
	// requests with Policy's options or those of a grid already opened
	// are admitted as usual. 0: only Policy's options run on the
	// cluster. Without Cluster it is not used (an own engine closes
	// with its last request).
	PolicyGrids int
	// GridRetries is, with Cluster, how many times a request whose grid
	// is lost (a node of it killed, restarted or unreachable: an error
	// wrapping ErrGridLost) runs again on a new grid (1; 0: never, the
	// request fails with 503 and Retry-After, or an error event once its
	// stream has begun). The retry creates a new sequence, prefills the
	// prompt again and feeds the tokens generated before the loss
	// through decode steps, their logits unused, so that the sequence
	// holds what the lost one held and the request goes on where it was:
	// the client sees no gap besides the time it took, greedy tokens are
	// those of a run without the loss and a sampled request's sampler
	// goes on with its own stream. A request of several choices (n > 1,
	// whose forks share its prompt's pages) is not retried: it fails
	// with the loss's error, which says so. Without Cluster it is not
	// used.
	GridRetries int
	// GridRetryWait bounds how long a retried request's new sequence
	// keeps being created again while the cluster answers unavailable
	// (10s): until membership declares a killed node dead, placement may
	// choose it again. Its attempts back off from 50ms to 1s; the
	// request's own deadline bounds them too.
	GridRetryWait time.Duration
	// ClusterWait bounds, with a Cluster that reports its nodes' free
	// pages (ClusterCapacity) and CapacityPages 0, how long New asks it
	// until the pool it sizes from them holds one request of the
	// longest context (30s; 0: one look); New then fails with
	// ErrNoClusterCapacity.
	ClusterWait time.Duration
	// ClusterResize, with a pool sized from a ClusterCapacity's nodes
	// (CapacityPages 0), is how often the server looks at the nodes
	// again to follow them as they join and leave (2s; 0: the pool is
	// sized once, at New). A look sizes the pool as New does, counting
	// the pools of the server's own grids as free on their nodes; when
	// the looks agree on another size for 2s (the nodes gossip their
	// free pages a moment after a grid opens or closes), the pool takes
	// it at the scheduler's next iteration. It shrinks unless a grid of
	// the server's at the pool now is still open (its pages are the
	// server's, whoever took the rest); then the newest running requests
	// that no longer fit go back to the queue to run again from their
	// prompt (with GridRetries, one choice each), else fail with 503
	// (code "pool_shrunk"), as do queued ones that will never fit. It
	// grows only as far as a grid
	// of the new size fits beside the server's grids open now (the
	// coordinator keys grids by their pool: the old ones stay until
	// their sequences end and the coordinator closes them idle). New
	// sequences are created on grids of the new size; the prefix cache
	// is emptied.
	ClusterResize time.Duration
	// CapacityPages is the engine's page pool per shard; with Cluster,
	// the pool of every rank of the requests' grids. Every started
	// request reserves the pages of its prompt plus max_tokens in it
	// (over CP shards: its share per shard); a queued request starts
	// when its pages fit. 0 (the default): New sizes it from memory, as
	// vLLM's gpu_memory_utilization does: MemoryFraction of the memory
	// available once the model is loaded (/proc/meminfo's MemAvailable,
	// capped by the memory cgroup's room and by a positive MemoryLimit)
	// over the host bytes one page costs on every shard, at most the
	// pages of MaxRunning requests of the longest context (MaxContext or
	// the model's), and New fails, naming the flags, when not even one
	// request of that context fits. With a device Backend whose pages
	// are DeviceResident (the device executor's layout) it is sized from
	// the device's memory instead, read when New runs, so after the
	// executor's weights and workspace are allocated: the pool takes
	// what DeviceMemoryFraction of the device's total memory leaves
	// besides what is used already, at the device bytes a page costs
	// (Engines.DeviceBytes: K/V in the pages' type, summaries, page
	// tables), with the same bounds and refusal. With a Cluster that
	// reports its nodes' free pages (ClusterCapacity) it is sized from
	// them when New runs: the most pages per rank with which the ranks
	// of the server's grid and of PolicyGrids grids of requests' own
	// options all fit the nodes' free pages (each rank reserves the
	// whole pool on its node), with the same bounds, waiting up to
	// ClusterWait for one request of the longest context to fit, then
	// follows the nodes as they come and go (ClusterResize). With
	// another Cluster, or a Backend without
	// DeviceResident, give it.
	// Server.PoolSize says how it was sized.
	CapacityPages int
	// MemoryFraction is the share of the available memory a pool sized
	// from memory takes (DefaultMemoryFraction, 0.5; 0 < f <= 0.95).
	MemoryFraction float64
	// DeviceMemoryFraction is, for a pool sized from a device's memory
	// (CapacityPages 0 with DeviceResident pages on a Backend), the share
	// of the device's total memory the process may take in all: weights,
	// workspace, scratch and the pool, as vLLM's gpu_memory_utilization
	// (memlimit.DefaultDeviceFraction, 0.9; 0 < f <= 1).
	DeviceMemoryFraction float64
	// MemAvailable reads the memory available for a pool sized from
	// memory (nil: memlimit.Available); tests give a fake.
	MemAvailable func() (int64, error)
	// MemoryLimit bounds the engine's host pools: bytes, 0 (the memory
	// available when New runs) or -1 (no check). With Cluster the
	// workers check their own pools and it bounds the model's weights
	// only (Load).
	MemoryLimit int64
	// PrefixCaching keeps the full pages of prompts' prefixes (with
	// their summaries) as sequences of the main engine, or with Cluster
	// as sequences on the grid of Policy's requests (forks of the
	// prompts' cluster sequences, their pages and summaries shared on
	// every rank), that later requests with the same token prefix fork
	// instead of prefilling it again (on by default; requests of their
	// own selection options neither use nor fill it). A grid's loss
	// drops its entries (Stats.PrefixCacheLost), so a request run again
	// on a new grid (GridRetries) prefills anew rather than forking a
	// dead grid's. Pages are keyed by a hash chain over their token ids; the
	// cache gives way, least recently used first, to every request that
	// needs its pages, and holds at most PrefixCachePages pages per shard
	// (0: as many as the pool leaves free when prompts are prefilled on a
	// device (Prefiller); else a quarter of CapacityPages, since a prompt
	// prefilled on the CPU keeps a float32 copy of its keys and values in
	// host memory besides the pool while it is cached).
	PrefixCaching    bool
	PrefixCachePages int
	// GrowReservations reserves a request's pages as its sequence grows,
	// as vLLM does, instead of its whole context (prompt plus max_tokens)
	// when it starts: a request starts when the pages of its prompt and
	// its next token fit, and every decode step reserves the page it is
	// about to open. When the pool has no page left for it (the prefix
	// cache gave way first), the newest running request that grows is
	// preempted (vLLM's recompute): its sequence is released, its pages
	// go back to the pool, and it returns to the front of the queue; when
	// its pages fit again its prompt is prefilled anew and the tokens it
	// had generated are fed through decode steps (their logits unused),
	// so that it goes on where it was: its greedy tokens are those of a
	// run without preemption and a sampled request's sampler goes on
	// with its own stream; the client sees only the pause
	// (Stats.Preemptions counts them). Only requests of one sequence (one
	// prompt, n = 1) on the main in-process engine grow: a request of
	// several choices (whose forks share its pages), one of its own
	// selection options (whose engine its reservation sizes) and, with a
	// Cluster, every request reserve their whole context as without it.
	// A request whose whole context could never fit the pool is still
	// refused (400). On by default (DefaultConfig); off, every request
	// reserves its whole context when it starts, so fewer run at once
	// but none is ever preempted.
	GrowReservations bool
	// MaxRunning caps the sequences prefilling or decoding at once, the
	// decode batch (16); each choice of a request (n, a batch of
	// prompts) is a sequence.
	MaxRunning int
	// MaxQueued caps the admitted sequences waiting for a running slot
	// or for their pages (64); past it requests are refused with 429.
	MaxQueued int
	// ChunkTokens is the prompt tokens one scheduler iteration prefills
	// at most (512): longer prompts are prefilled in chunks between
	// decode steps.
	ChunkTokens int
	// MaxBatchedTokens is the tokens one scheduler iteration runs at
	// most (vLLM's max_num_batched_tokens): a decode token for every
	// decoding sequence first, then prompt tokens up to the rest (and
	// ChunkTokens). With d sequences decoding, an iteration prefills at
	// most MaxBatchedTokens - d prompt tokens, so a lower value keeps the
	// decoding sequences' inter-token latency closer to their decode
	// step's while a long prompt prefills, and prefills it in more
	// iterations. 0 (the default): ChunkTokens + MaxRunning, so decoding
	// never shrinks a chunk; else at least MaxRunning, so that a prompt
	// token is left beside the most decoding sequences there can be.
	MaxBatchedTokens int
	// MaxITLFactor bounds a scheduler iteration's time, while sequences
	// decode, to this many times their decode step alone: the iteration
	// prefills only as many prompt tokens as fit (factor - 1) decode
	// steps by the costs the scheduler measures (the decode step's
	// moving average, and a prompt chunk's prefill time as a fixed cost
	// per chunk plus a line per token in its context, which the dense
	// prefill attention reads whole), and a chunk only once its tokens
	// take at least its fixed cost (on a 2-core CPU the fixed cost is
	// about a decode step of a few streams, so one-token chunks were
	// mostly fixed cost: 2026-12-07-prefill-chunk-cost-cpu.md). It keeps
	// the running streams' inter-token latency near factor times their
	// decode step while a long prompt prefills, whatever the prompt's
	// context; MaxBatchedTokens and ChunkTokens still bound the tokens.
	// When not even one prompt token fits, the iteration prefills none
	// and its unspent time carries over to the next ones, so a token
	// dearer than one iteration's share runs once they cover it (a long
	// context's token on a CPU costs about a decode step of a few
	// streams); after 16 such iterations in a row a token runs whatever
	// it is predicted to cost, so no prefill starves. Without decoding
	// sequences a prompt prefills in ChunkTokens chunks as without the
	// bound. It bounds the prompts prefilled on the CPU only: a device
	// chunk (Prefiller) costs mostly per chunk, not per token, so those
	// keep the token bounds alone. 2 (the default): the running streams'
	// gaps about twice their decode step while a prompt prefills beside
	// them (2026-12-07-prefill-itl-defaults-cpu.md); 0 turns it off (the
	// token bounds alone); else 1 to 100 (1: one prompt token per
	// iteration).
	MaxITLFactor float64
	// MaxContext bounds a request's prompt plus max_tokens (0: the
	// model's max_position_embeddings; no bound when both are 0 besides
	// the pool).
	MaxContext int
	// MaxBodyBytes bounds a request body (1 MiB); larger bodies get 413.
	MaxBodyBytes int64
	// Sampling is the default temperature and top_p of requests that
	// give none (zero value: OpenAI's, 1 and 1; Load reads the
	// checkpoint's generation_config.json, LoadSampling), and the end
	// tokens generation_config.json adds to config.json's EOS.
	Sampling Sampling
	// SSEKeepAlive is how long a stream may send nothing before it writes
	// an SSE comment (": keep-alive"), so that proxies with idle timeouts
	// keep a long prefill's stream open (15s; 0: never).
	SSEKeepAlive time.Duration
	// ChatTemplate renders the messages of POST /v1/chat/completions into
	// the prompt (nil: Load takes the checkpoint's, chat.Load; New has
	// none and chat requests get 400 saying so).
	ChatTemplate *chat.Template
	// RequestTimeout bounds a request from its arrival to its last token
	// (5 minutes; 0: no deadline besides the client's). Past it the
	// request gets 504 (or an error event when streaming) and leaves at
	// the next iteration boundary.
	RequestTimeout time.Duration
	// DefaultMaxTokens is max_tokens when a request gives none (16, as
	// OpenAI's legacy completions), or RestOfContext (-1): the rest of
	// the context after the prompt (the longest of a batch), vLLM's
	// default, which needs a context bound (MaxContext or the model's
	// positions). Without GrowReservations (or for a request that
	// does not grow) a started request reserves the pages of its prompt
	// plus max_tokens in the pool at once, so with RestOfContext every
	// such request reserves a whole max_model_len of pages and fewer run
	// at once; growing requests reserve only what they fill. A completion that reaches max_tokens ends with
	// finish_reason "length"; a prompt plus max_tokens past the context
	// or the pool gets 400 context_length_exceeded.
	DefaultMaxTokens int
	// RetryAfter is the Retry-After of 429 and 503 answers (1s; sent in
	// whole seconds, at least 1).
	RetryAfter time.Duration
	// Workers is the goroutines of the prefill attention kernel (0:
	// GOMAXPROCS); the model's matrix products use the model's own.
	Workers int
	// Seed seeds the sampling of requests that give no seed (0): request
	// i of the server gets a seed derived from Seed and i.
	Seed uint64
	// Monitor is the online quality monitor (see MonitorConfig; off by
	// default).
	Monitor MonitorConfig
	// History is how many finished requests the server keeps (prompt,
	// output, settings) for GET /admin/requests/{id} and its dense
	// replay (64; 0: none). The oldest is forgotten first.
	History int
	// Backend is the kernel backend of the in-process engines (nil: the
	// CPU's); DeviceResident keeps their pages only in the backend's
	// device memory (GridSpec's).
	Backend        kernels.Backend
	DeviceResident bool
	// KVDType is the pages' storage type with a Backend (float32, the
	// zero value; bf16 or f16 on a GPU).
	KVDType plan.DType
	// Decoder runs the decode steps (nil: the model's DecodeBatch on the
	// CPU). model/gpu.Decoder runs them on the device executor: then the
	// engines must hold their pages on its device (Backend,
	// DeviceResident), CP and TP are 1, there is no Cluster and no
	// Monitor (both need every layer's q and k on the host), and requests
	// whose selector is neither Policy's nor dense are refused (400: the
	// executor runs the fused Quest step). Prompts are prefilled by
	// Prefiller when set, else by the model on the CPU into the device's
	// pages.
	Decoder Decoder
	// Prefiller runs prompts on the device (model/gpu.Decoder, with
	// Decoder's conditions): a prompt's sequence is created on its engine
	// before the first chunk and each chunk of ChunkTokens goes straight
	// into it. Prompts whose every position's log-probabilities are asked
	// for (echo with logprobs) are prefilled on the CPU.
	Prefiller Prefiller
	// Logger receives the server's logs (nil: none).
	Logger *slog.Logger
	// Observe, when set, gets every admitted request's timing at its
	// end (completed, cancelled or failed), on the scheduler's goroutine:
	// it must return quickly (questd feeds histograms and logs a line).
	Observe func(RequestTiming)
	// Now is the clock of the responses' created times (nil: time.Now).
	Now func() time.Time
}

// RestOfContext is Config.DefaultMaxTokens for vLLM's default: the rest
// of the context after the prompt.
const RestOfContext = -1

// ITLFactorMax is the largest Config.MaxITLFactor.
const ITLFactorMax = 100

// DefaultConfig returns the documented defaults (ModelName empty).
func DefaultConfig() Config {
	return Config{
		Policy:               plan.DefaultPolicy(),
		CP:                   1,
		TP:                   1,
		Selection:            plan.Exact,
		CapacityPages:        0,
		MemoryFraction:       DefaultMemoryFraction,
		DeviceMemoryFraction: memlimit.DefaultDeviceFraction,
		MaxRunning:           16,
		MaxQueued:            64,
		PolicyGrids:          2,
		GridRetries:          1,
		GridRetryWait:        10 * time.Second,
		ClusterWait:          30 * time.Second,
		ClusterResize:        2 * time.Second,
		ChunkTokens:          512,
		MaxITLFactor:         2,
		MaxBodyBytes:         1 << 20,
		RequestTimeout:       5 * time.Minute,
		SSEKeepAlive:         15 * time.Second,
		DefaultMaxTokens:     16,
		RetryAfter:           time.Second,
		Monitor:              MonitorConfig{Queue: 64, TopR: 10},
		History:              64,
		PrefixCaching:        true,
		GrowReservations:     true,
	}
}

// Validate reports the first unusable value. The engine's own checks
// (geometry against the grid) run when New builds it.
func (c Config) Validate() error {
	if err := c.Policy.Validate(); err != nil {
		return fmt.Errorf("serve config: %w", err)
	}
	switch {
	case c.Policy.PageSize > 4096:
		return fmt.Errorf("serve config: page size %d: want 1..4096", c.Policy.PageSize)
	case c.CP < 1 || c.CP > 64:
		return fmt.Errorf("serve config: cp %d: want 1..64", c.CP)
	case c.TP < 1 || c.TP > 64:
		return fmt.Errorf("serve config: tp %d: want 1..64", c.TP)
	case c.CapacityPages < 0:
		return fmt.Errorf("serve config: capacity %d pages: want 0 (sized from memory) or more", c.CapacityPages)
	case c.CapacityPages == 0 && !(c.MemoryFraction > 0 && c.MemoryFraction <= 0.95):
		return fmt.Errorf("serve config: memory fraction %v: want 0 < f <= 0.95 (a pool sized from memory)", c.MemoryFraction)
	case c.CapacityPages == 0 && c.Backend != nil && c.DeviceResident && !(c.DeviceMemoryFraction > 0 && c.DeviceMemoryFraction <= 1):
		return fmt.Errorf("serve config: device memory fraction %v: want 0 < f <= 1 (a pool sized from the device's memory)", c.DeviceMemoryFraction)
	case c.MemoryLimit < memlimit.NoLimit:
		return fmt.Errorf("serve config: memory limit %d: want bytes, 0 (available memory) or -1 (no check)", c.MemoryLimit)
	case c.PrefixCachePages < 0 || (c.CapacityPages > 0 && c.PrefixCachePages > c.CapacityPages):
		return fmt.Errorf("serve config: prefix cache %d pages: want 0 (the pool's bound) to the capacity, %d", c.PrefixCachePages, c.CapacityPages)
	case c.MaxRunning < 1:
		return fmt.Errorf("serve config: max running %d: want at least 1", c.MaxRunning)
	case c.MaxQueued < 0:
		return fmt.Errorf("serve config: max queued %d: want 0 or more", c.MaxQueued)
	case c.PolicyGrids < 0:
		return fmt.Errorf("serve config: policy grids %d: want 0 or more", c.PolicyGrids)
	case c.GridRetries < 0:
		return fmt.Errorf("serve config: grid retries %d: want 0 (never) or more", c.GridRetries)
	case c.GridRetryWait < 0:
		return fmt.Errorf("serve config: grid retry wait %v: want 0 (one attempt) or more", c.GridRetryWait)
	case c.ClusterWait < 0:
		return fmt.Errorf("serve config: cluster wait %v: want 0 (one look) or more", c.ClusterWait)
	case c.ClusterResize < 0:
		return fmt.Errorf("serve config: cluster resize %v: want 0 (sized once) or more", c.ClusterResize)
	case c.ChunkTokens < 1:
		return fmt.Errorf("serve config: chunk %d tokens: want at least 1", c.ChunkTokens)
	case c.MaxBatchedTokens != 0 && c.MaxBatchedTokens < c.MaxRunning:
		return fmt.Errorf("serve config: max batched %d tokens: want 0 (chunk plus max running) or at least max running, %d (a decode token each, and a prompt token left)", c.MaxBatchedTokens, c.MaxRunning)
	case c.MaxITLFactor != 0 && !(c.MaxITLFactor >= 1 && c.MaxITLFactor <= ITLFactorMax):
		return fmt.Errorf("serve config: max ITL factor %v: want 0 (off) or 1..%v", c.MaxITLFactor, ITLFactorMax)
	case c.MaxContext < 0:
		return fmt.Errorf("serve config: max context %d: want 0 (the model's) or more", c.MaxContext)
	case c.SSEKeepAlive < 0 || (c.SSEKeepAlive > 0 && c.SSEKeepAlive < 10*time.Millisecond):
		return fmt.Errorf("serve config: SSE keep-alive %v: want 0 (never) or at least 10ms", c.SSEKeepAlive)
	case c.MaxBodyBytes < 1:
		return fmt.Errorf("serve config: max body %d bytes: want at least 1", c.MaxBodyBytes)
	case c.RequestTimeout < 0:
		return fmt.Errorf("serve config: request timeout %v: want 0 (none) or more", c.RequestTimeout)
	case c.DefaultMaxTokens < 1 && c.DefaultMaxTokens != RestOfContext:
		return fmt.Errorf("serve config: default max tokens %d: want at least 1, or -1 (the rest of the context)", c.DefaultMaxTokens)
	case c.RetryAfter < 0:
		return fmt.Errorf("serve config: retry after %v: want 0 or more", c.RetryAfter)
	case c.Workers < 0 || c.Workers > 256:
		return fmt.Errorf("serve config: workers %d: want 0..256", c.Workers)
	}
	if c.Prefiller != nil && c.Decoder == nil {
		return errors.New("serve config: a Prefiller without a Decoder (the device prefill fills the sequences the device executor decodes)")
	}
	if c.Decoder != nil {
		switch {
		case c.Cluster != nil:
			return errors.New("serve config: a Decoder with a Cluster (the device executor decodes an in-process engine's sequences)")
		case c.CP != 1 || c.TP != 1:
			return fmt.Errorf("serve config: a Decoder with a %d x %d grid (the device executor runs one rank)", c.CP, c.TP)
		case c.Monitor.Rate > 0:
			return errors.New("serve config: a Decoder with the quality monitor on (it replays every layer's q and k, which stay on the device)")
		case c.Backend == nil || !c.DeviceResident:
			return errors.New("serve config: a Decoder needs the engines' pages on its device (Backend and DeviceResident)")
		case c.Policy.Selector != plan.Quest:
			return fmt.Errorf("serve config: a Decoder with selector %s (the device executor runs quest)", c.Policy.Selector)
		}
	}
	if c.History < 0 {
		return fmt.Errorf("serve config: history %d requests: want 0 (none) or more", c.History)
	}
	if err := c.Monitor.validate(); err != nil {
		return err
	}
	if _, err := plan.ParseSelectMode(c.Selection.String()); err != nil {
		return fmt.Errorf("serve config: %w", err)
	}
	return nil
}

// Decoder runs one decode step of a batch of sequences, as
// model.Model.DecodeBatch (whose contract it keeps): the serving loop's
// decode step, on the CPU or on a device (model/gpu.Decoder).
type Decoder interface {
	DecodeBatch(ctx context.Context, attns []model.Attention, tokens []int) ([][]float32, error)
}

// SamplingDecoder is a Decoder that can also pick the next tokens on its
// device (model/gpu.Decoder): DecodeSample runs the step as DecodeBatch
// does and returns each sequence's token, picked with params[i] (what its
// model.Sampler's Params gives: the token Sample would pick from the
// step's logits), each sequence's argmax, and the logits of the sequences
// whose want[i] is set (nil for the others). The serving loop uses it
// when the Decoder has it, so that no logits cross to the host but those
// a request's logprobs need.
type SamplingDecoder interface {
	Decoder
	DecodeSample(ctx context.Context, attns []model.Attention, tokens []int, params []kernels.SampleParams, want []bool) (ids, greedy []int, logits [][]float32, err error)
}

// Prefiller runs prompt chunks of the served sequences on a device
// (model/gpu.Decoder's Prefill).
type Prefiller interface {
	// Prefill appends tokens to a's sequence (after its Len tokens) and
	// returns the last token's logits; a failure may leave the tokens in
	// some layers (the sequence is released).
	Prefill(ctx context.Context, a model.Attention, tokens []int) ([]float32, error)
}

// errNoName is New's refusal of a config without a model name.
var errNoName = errors.New("serve config: no model name (set ModelName)")

// errNoEngines is New's refusal of a config without Engines.
var errNoEngines = errors.New("serve config: no Engines (set it to internal/serveengine.Engines())")
