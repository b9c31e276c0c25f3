// Package client is the Go client of questrt's Decode API (api/decode/v1):
// sequences, prefill appends and decode steps of the attention layers on a
// questd cluster, with the engine's shapes (float32, row-major), so that
// code written against the in-process engine (replay, the model executor)
// runs against a cluster the same way. Errors are gRPC status errors; use
// status.Code to act on them (UNAVAILABLE: a node the call needed is
// gone; see api/decode/v1/decode.proto).
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/api/wire"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/plan"
)

// Options configure Dial.
type Options struct {
	// Creds secure the connection; nil means plaintext (a local cluster).
	Creds credentials.TransportCredentials
	// MaxMessageBytes bounds one message each way (256 MiB).
	MaxMessageBytes int
	// Token, when set, is sent with every call as the metadata
	// "authorization: Bearer <Token>" (questd --token-file). A bearer
	// token travels in the clear without TLS, so with plaintext (Creds
	// nil or insecure) Dial accepts it only for a loopback address (127.0.0.0/8, ::1,
	// localhost: a local cluster, the tests) and refuses it otherwise.
	Token string
	// RecoveredAttempts bounds the calls Recovered makes: a node that
	// answers UNAVAILABLE (its recovery not finished after the wait it
	// allows, a node of the grid not reachable yet) is asked again, up
	// to this many calls in all, after a backoff from 100 ms doubling up
	// to 2 s (longer when the node's RetryInfo asks for it), and never
	// past the caller's context. Recovered only reads, so a retry is
	// safe; no call that changes state is retried. 0 means
	// DefaultRecoveredAttempts; 1 turns retries off.
	RecoveredAttempts int
}

// DefaultRecoveredAttempts is Options.RecoveredAttempts' default.
const DefaultRecoveredAttempts = 5

// TokenCredentials returns the per-call credentials that send token as
// "authorization: Bearer <token>" on a connection to addr secured by
// creds (nil: plaintext). Over plaintext, where the token travels in the
// clear, only a loopback addr is accepted (a local cluster, tests);
// otherwise it returns an error.
func TokenCredentials(addr, token string, creds credentials.TransportCredentials) (credentials.PerRPCCredentials, error) {
	plain := creds == nil || creds.Info().SecurityProtocol == "insecure"
	if plain && !loopback(addr) {
		return nil, fmt.Errorf("%s: a bearer token goes over plaintext only to a loopback address: use TLS", addr)
	}
	return tokenCreds{token: token, secure: !plain}, nil
}

// tokenCreds sends the bearer token with every call.
type tokenCreds struct {
	token  string
	secure bool // the connection has transport security
}

func (t tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + t.token}, nil
}

// RequireTransportSecurity is false only for the plaintext loopback
// connections Dial allows a token on.
func (t tokenCreds) RequireTransportSecurity() bool { return t.secure }

// loopback reports whether the host of addr is a loopback address or
// localhost.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// Client talks to one questd node; calls for sequences that another node
// coordinates are forwarded by the node.
type Client struct {
	cc  *grpc.ClientConn
	api decodev1.DecodeClient
	geo Geometry // the node's default
	max int      // message limit
	// attempts bounds the calls of Recovered (Options.RecoveredAttempts).
	attempts int

	mu   sync.Mutex
	seqs map[string]Geometry // sequences created with their own config
	// handles are the sequences' decode.Stepper handles.
	handles handles
	// kept are the Steps streams left open for the next decode step.
	kept keptSteps
}

// Geometry is the cluster's model geometry as Status reports it (the
// shape of a GridConfig message).
type Geometry struct {
	Layers, QHeads, KVHeads, HeadDim, PageSize, CP, TP int
	Policy                                             plan.Policy
	Selection                                          plan.SelectMode
}

// geometryOf is the geometry of a GridConfig message (a node's Status,
// or a config for CreateWith), not validated.
func geometryOf(c *workerv1.GridConfig) (Geometry, error) {
	if c == nil {
		return Geometry{}, errors.New("missing config")
	}
	pol, err := wire.Policy(c.GetPolicy())
	if err != nil {
		return Geometry{}, err
	}
	mode, err := plan.ParseSelectMode(c.GetMode())
	if err != nil {
		return Geometry{}, fmt.Errorf("mode: %w", err)
	}
	return Geometry{Layers: int(c.GetLayers()), QHeads: int(c.GetQHeads()), KVHeads: int(c.GetKvHeads()), HeadDim: int(c.GetHeadDim()),
		PageSize: int(c.GetPageSize()), CP: int(c.GetCp()), TP: int(c.GetTp()), Policy: pol, Selection: mode}, nil
}

// check reports whether g is a usable grid's geometry: positive sizes,
// query heads a multiple of the KV heads, which split over TP, and a
// valid policy at g's page size.
func (g Geometry) check() error {
	pg := plan.Geometry{QHeads: g.QHeads, KVHeads: g.KVHeads, HeadDim: g.HeadDim, PageSize: g.PageSize}
	switch {
	case g.Layers < 1:
		return fmt.Errorf("%d layers", g.Layers)
	case g.CP < 1 || g.TP < 1:
		return fmt.Errorf("cp %d and tp %d must be positive", g.CP, g.TP)
	}
	if err := pg.Validate(); err != nil {
		return err
	}
	if g.KVHeads%g.TP != 0 {
		return fmt.Errorf("%d KV heads do not split over tp %d", g.KVHeads, g.TP)
	}
	return g.Policy.WithGeometry(pg).Validate()
}

// Dial connects to the node at addr and reads its geometry (Status),
// within ctx.
func Dial(ctx context.Context, addr string, opt Options) (*Client, error) {
	creds := opt.Creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	max := opt.MaxMessageBytes
	if max <= 0 {
		max = 256 << 20
	}
	dopts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(max), grpc.MaxCallSendMsgSize(max))},
		wire.DialFlowOptions()...) // no BDP pings on the replies
	if opt.Token != "" {
		tc, err := TokenCredentials(addr, opt.Token, creds)
		if err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
		dopts = append(dopts, grpc.WithPerRPCCredentials(tc))
	}
	cc, err := grpc.NewClient(addr, dopts...)
	if err != nil {
		return nil, fmt.Errorf("client: %s: %w", addr, err)
	}
	attempts := opt.RecoveredAttempts
	if attempts <= 0 {
		attempts = DefaultRecoveredAttempts
	}
	c := &Client{cc: cc, api: decodev1.NewDecodeClient(cc), max: max, attempts: attempts, seqs: map[string]Geometry{}}
	st, err := c.api.Status(ctx, &decodev1.StatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		cc.Close()
		return nil, fmt.Errorf("client: status of %s: %w", addr, err)
	}
	g, err := geometryOf(st.GetConfig())
	if err == nil {
		err = g.check()
	}
	if err != nil {
		cc.Close()
		return nil, fmt.Errorf("client: %s: config: %w", addr, err)
	}
	c.geo = g
	return c, nil
}

// Geometry returns the cluster's geometry.
func (c *Client) Geometry() Geometry { return c.geo }

// geoOf is the geometry of sequence seq: its own config's when this
// client created it with one (or forked it from one), else the node's.
func (c *Client) geoOf(seq string) Geometry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g, ok := c.seqs[seq]; ok {
		return g
	}
	return c.geo
}

// CreateWith starts an empty sequence with its own config (geometry,
// layers, CP x TP grid, pages per rank, budget policy, selection mode:
// a worker.Config as worker/remote.GridConfigProto encodes it, which the
// node validates); the client then shapes that sequence's tensors by it.
func (c *Client) CreateWith(ctx context.Context, p plan.Placement, cfg *workerv1.GridConfig) (string, []string, error) {
	if cfg == nil {
		return "", nil, errors.New("client: create: no config (a worker.Config that does not encode?)")
	}
	g, err := geometryOf(cfg)
	if err != nil {
		return "", nil, fmt.Errorf("client: create: config: %w", err)
	}
	r, err := c.api.Create(ctx, &decodev1.CreateRequest{Placement: p.String(), Config: cfg})
	if err != nil {
		return "", nil, err
	}
	c.mu.Lock()
	c.seqs[r.GetSequence()] = g
	c.mu.Unlock()
	return r.GetSequence(), r.GetNodes(), nil
}

// API returns the raw Decode client.
func (c *Client) API() decodev1.DecodeClient { return c.api }

// Close closes the connection.
func (c *Client) Close() error {
	c.kept.close()
	return c.cc.Close()
}

// Status returns the node's status.
func (c *Client) Status(ctx context.Context) (*decodev1.StatusReply, error) {
	return c.api.Status(ctx, &decodev1.StatusRequest{})
}

// Create starts an empty sequence; it returns its id and the nodes of its
// ranks.
func (c *Client) Create(ctx context.Context, p plan.Placement) (string, []string, error) {
	r, err := c.api.Create(ctx, &decodev1.CreateRequest{Placement: p.String()})
	if err != nil {
		return "", nil, err
	}
	return r.GetSequence(), r.GetNodes(), nil
}

// Append appends tokens to one layer: k and v are [n][KVHeads][HeadDim].
// A long append goes in chunks of whole tokens under the message limit;
// a chunk that fails leaves the earlier chunks appended (Len tells).
func (c *Client) Append(ctx context.Context, seq string, layer int, k, v []float32) error {
	g := c.geoOf(seq)
	row := g.KVHeads * g.HeadDim
	if row == 0 || len(k)%row != 0 || len(v) != len(k) {
		return fmt.Errorf("client: append: %d keys and %d values are not the same rows of %d", len(k), len(v), row)
	}
	n := len(k) / row
	// Two tensors of 4-byte floats per token, with room for framing.
	per := max(1, (c.max/2-4096)/(8*row))
	for lo := 0; lo < n; lo += per {
		hi := min(n, lo+per)
		_, err := c.api.Append(ctx, &decodev1.AppendRequest{Sequence: seq, Layer: uint32(layer),
			K: wire.Float32Tensor(k[lo*row:hi*row], hi-lo, g.KVHeads, g.HeadDim),
			V: wire.Float32Tensor(v[lo*row:hi*row], hi-lo, g.KVHeads, g.HeadDim)})
		if err != nil {
			if lo > 0 {
				return fmt.Errorf("client: append tokens %d..%d of %d (the first %d are in): %w", lo, hi, n, lo, err)
			}
			return err
		}
	}
	return nil
}

// Item is one sequence's part of a step: Q is [QHeads][HeadDim]; K and V,
// when set, the new token's [KVHeads][HeadDim].
type Item struct {
	Seq          string
	Q, K, V      []float32
	BudgetTokens int
}

// StepOptions are the step's options (those of decode.Options that the
// Step RPC carries).
type StepOptions struct {
	ForceDense, Phased, Diagnostics bool
}

// Diag is one item's diagnostics: decode.Diagnostics (every field, the
// pages read counted from the selection) and the dense reference's LSE.
type Diag struct {
	decode.Diagnostics
	DenseLSE []float32
}

// StepResult is a step's answer: O [items][QHeads][HeadDim], LSE
// [items][QHeads], a plan per item, Diag per item with diagnostics, and
// the coordinator's wall time of the step.
type StepResult struct {
	O, LSE []float32
	Plans  []plan.Plan
	Diag   []Diag
	Total  time.Duration
	// Time is the phase times of CP rank 0 of TP group 0.
	Time Times
}

// Times are the wall times of a step's phases on one rank.
type Times struct {
	Score, TopK, Select, Attend, Merge, Fused time.Duration
}

// Step runs one decode step of one layer for items (all coordinated by
// one node).
func (c *Client) Step(ctx context.Context, layer int, items []Item, opt StepOptions) (*StepResult, error) {
	if len(items) == 0 {
		return nil, errors.New("client: step: no items")
	}
	g := c.geoOf(items[0].Seq)
	req := &decodev1.StepRequest{Layer: uint32(layer), ForceDense: opt.ForceDense, Phased: opt.Phased, Diagnostics: opt.Diagnostics,
		Items: encodeItems(g, items)}
	rep, err := c.api.Step(ctx, req)
	if err != nil {
		return nil, err
	}
	res, err := decodeOutputs(g, len(items), rep.GetO(), rep.GetLse(), rep.GetPlans(), rep.GetTime(), rep.GetTotalNs())
	if err != nil {
		return nil, fmt.Errorf("client: step reply: %w", err)
	}
	for i, d := range rep.GetDiag() {
		dg, err := diag(d, g, res.Plans[i].Pages)
		if err != nil {
			return nil, fmt.Errorf("client: step reply: diag[%d]: %w", i, err)
		}
		res.Diag = append(res.Diag, dg)
	}
	return res, nil
}

// NextItems fills the next layer's items (Q, and K and V when the step
// has a new token) from the previous layer's result, in place.
//
// Deprecated: Decode's callback; use the client's decode.Stepper.
type NextItems func(layer int, items []Item, res *StepResult) error

// Decode runs one decode step over layers [first, last) for items of one
// grid through the Steps stream: the workers get the step's plan once,
// and each layer costs one message each way. next fills each later
// layer's items from the previous layer's result; the last layer's
// result is returned (Total: the coordinator's time of the whole step).
//
// Deprecated: the caller should own the layer loop: Begin (with
// decode.Batch.FirstLayer and Layers for [first, last)), Layer per
// layer and End, the client's decode.Stepper. Decode stays for one
// release for callers outside this module.
func (c *Client) Decode(ctx context.Context, first, last int, items []Item, opt StepOptions, next NextItems) (*StepResult, error) {
	if len(items) == 0 {
		return nil, errors.New("client: decode: no items")
	}
	g := c.geoOf(items[0].Seq)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.api.Steps(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&decodev1.StepsRequest{FirstLayer: uint32(first), LastLayer: uint32(last), Items: encodeItems(g, items),
		ForceDense: opt.ForceDense, Phased: opt.Phased}); err != nil {
		return nil, stepsErr(st, err)
	}
	n := len(items)
	for l := first; l < last; l++ {
		rep, err := st.Recv()
		if err != nil {
			return nil, err
		}
		res, err := decodeOutputs(g, n, rep.GetO(), rep.GetLse(), rep.GetPlans(), rep.GetTime(), rep.GetTotalNs())
		if err != nil {
			return nil, fmt.Errorf("client: steps reply: %w", err)
		}
		if l == last-1 {
			return res, nil
		}
		if err := next(l, items, res); err != nil {
			return nil, err
		}
		if err := st.Send(&decodev1.StepsRequest{Items: encodeItems(g, items)}); err != nil {
			return nil, stepsErr(st, err)
		}
	}
	return nil, errors.New("client: steps: no layers")
}

// stepsErr returns the stream's status after a failed Send (io.EOF: the
// server ended the stream, and Recv has its reason).
func stepsErr(st grpc.BidiStreamingClient[decodev1.StepsRequest, decodev1.StepsReply], err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := st.Recv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// encodeItems encodes a step's items in geometry g.
func encodeItems(g Geometry, items []Item) []*decodev1.StepItem {
	out := make([]*decodev1.StepItem, 0, len(items))
	for _, it := range items {
		pi := &decodev1.StepItem{Sequence: it.Seq, Q: wire.Float32Tensor(it.Q, g.QHeads, g.HeadDim), BudgetTokens: uint32(it.BudgetTokens)}
		if it.K != nil || it.V != nil {
			pi.K = wire.Float32Tensor(it.K, g.KVHeads, g.HeadDim)
			pi.V = wire.Float32Tensor(it.V, g.KVHeads, g.HeadDim)
		}
		out = append(out, pi)
	}
	return out
}

// decodeOutputs decodes the outputs of a step of n items (a StepReply's
// or a StepsReply's).
func decodeOutputs(g Geometry, n int, o, lse *workerv1.Tensor, plans []*decodev1.Plan, t *workerv1.Times, totalNs int64) (*StepResult, error) {
	res := &StepResult{Total: time.Duration(totalNs), Time: Times{Score: time.Duration(t.GetScoreNs()),
		TopK: time.Duration(t.GetTopkNs()), Select: time.Duration(t.GetSelectNs()), Attend: time.Duration(t.GetAttendNs()),
		Merge: time.Duration(t.GetMergeNs()), Fused: time.Duration(t.GetFusedNs())}}
	var err error
	if res.O, err = wire.Float32s(o, "o", n, g.QHeads, g.HeadDim); err != nil {
		return nil, err
	}
	if res.LSE, err = wire.Float32s(lse, "lse", n, g.QHeads); err != nil {
		return nil, err
	}
	for _, p := range plans {
		res.Plans = append(res.Plans, plan.Plan{Pages: int(p.GetPages()), K: int(p.GetK()), Rank: int(p.GetRank()),
			Sink: int(p.GetSink()), Local: int(p.GetLocal()), Dense: p.GetDense()})
	}
	if len(res.Plans) != n {
		return nil, fmt.Errorf("%d plans for %d items", len(res.Plans), n)
	}
	return res, nil
}

func diag(d *decodev1.Diagnostics, g Geometry, pages int) (Diag, error) {
	indptr, err := wire.Int32s(d.GetIndptr(), "indptr", g.QHeads+1)
	if err != nil {
		return Diag{}, err
	}
	flat, err := wire.Int32s(d.GetPages(), "pages", -1)
	if err != nil {
		return Diag{}, err
	}
	out := Diag{Diagnostics: decode.Diagnostics{RelL2: math.NaN(), AbsL2: d.GetAbsL2(), Recall: d.GetRecall(), MassRecall: d.GetMassRecall(),
		MinMassRecall: d.GetMinMassRecall(), HeadRecall: d.GetHeadRecall(), HeadMassRecall: d.GetHeadMassRecall(),
		SlackP50: d.GetSlackP50(), SlackP90: d.GetSlackP90(), SlackMax: d.GetSlackMax()}}
	if d.GetRelL2Defined() {
		out.RelL2 = d.GetRelL2()
	}
	for h := range g.QHeads {
		lo, hi := indptr[h], indptr[h+1]
		if lo < 0 || hi < lo || int(hi) > len(flat) {
			return Diag{}, errors.New("indptr out of range")
		}
		out.Selected = append(out.Selected, flat[lo:hi])
	}
	if out.DenseLSE, err = wire.Float32s(d.GetDenseLse(), "dense_lse", g.QHeads); err != nil {
		return Diag{}, err
	}
	if d.GetScores() != nil {
		sc, err := wire.Float32s(d.GetScores(), "scores", g.QHeads, pages)
		if err != nil {
			return Diag{}, err
		}
		for h := range g.QHeads {
			out.Scores = append(out.Scores, sc[h*pages:(h+1)*pages])
		}
	}
	for _, sel := range out.Selected {
		for _, p := range sel {
			if p < 0 || int(p) >= pages {
				return Diag{}, fmt.Errorf("selected page %d outside the %d pages", p, pages)
			}
		}
	}
	out.CountPages(g.QHeads/max(g.KVHeads, 1), pages)
	return out, nil
}

// Fork makes a child sequence sharing the parent's pages.
func (c *Client) Fork(ctx context.Context, seq string) (string, error) {
	r, err := c.api.Fork(ctx, &decodev1.ForkRequest{Sequence: seq})
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	if g, ok := c.seqs[seq]; ok {
		c.seqs[r.GetSequence()] = g
	}
	c.mu.Unlock()
	return r.GetSequence(), nil
}

// Rollback drops the last n tokens of every layer.
func (c *Client) Rollback(ctx context.Context, seq string, n int) error {
	_, err := c.api.Rollback(ctx, &decodev1.RollbackRequest{Sequence: seq, Tokens: uint64(max(n, 0))})
	return err
}

// Release frees a sequence.
func (c *Client) Release(ctx context.Context, seq string) error {
	_, err := c.api.Release(ctx, &decodev1.ReleaseRequest{Sequence: seq})
	if err == nil {
		c.mu.Lock()
		delete(c.seqs, seq)
		c.mu.Unlock()
		c.forget(seq)
		c.kept.drop(seq)
	}
	return err
}

// Len returns a sequence's length.
func (c *Client) Len(ctx context.Context, seq string) (int, error) {
	r, err := c.api.Length(ctx, &decodev1.LengthRequest{Sequence: seq})
	return int(r.GetLength()), err
}
