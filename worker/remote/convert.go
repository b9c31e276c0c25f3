package remote

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/questrt/questrt/api/wire"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/internal/offload"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// This file converts between package worker's messages and workerv1's.
// Encoding (enc) refuses what the wire cannot carry (negative counts);
// decoding (dec) refuses what does not fit the grid (dtypes, shapes, the
// dims the grid's geometry fixes, overflowing shapes), naming the field.
// Both keep the first error. A nil slice travels as an absent Tensor and
// comes back nil; an empty one travels with a zero in its shape and comes
// back empty (worker.AppendRequest.MirrorK and RankInput.MirrorK differ by
// that). In repeated fields (rollback tails, diagnostic scores) an absent
// entry is an empty Tensor message (no dtype, shape or data).

// anyDim is a dim of a wanted shape that the decoder does not know.
const anyDim = wire.AnyDim

// enc encodes one message.
type enc struct {
	what string // "append request"
	err  error
}

func (e *enc) fail(sentinel error, format string, args ...any) {
	if e.err == nil {
		e.err = fmt.Errorf("%w: %s: %s", sentinel, e.what, fmt.Sprintf(format, args...))
	}
}

func (e *enc) u32(field string, v int) uint32 {
	if v < 0 || uint64(v) > math.MaxUint32 {
		e.fail(worker.ErrBadMessage, "%s %d is not a uint32", field, v)
		return 0
	}
	return uint32(v)
}

func (e *enc) u64(field string, v int) uint64 {
	if v < 0 {
		e.fail(worker.ErrBadMessage, "%s %d is negative", field, v)
		return 0
	}
	return uint64(v)
}

// rank encodes a rank; a negative one is not hosted anywhere.
func (e *enc) rank(field string, r worker.Rank) *workerv1.Rank {
	if r.TP < 0 || r.CP < 0 || uint64(r.TP) > math.MaxUint32 || uint64(r.CP) > math.MaxUint32 {
		e.fail(worker.ErrNotHosted, "%s %v", field, r)
		return &workerv1.Rank{}
	}
	return &workerv1.Rank{Tp: uint32(r.TP), Cp: uint32(r.CP)}
}

// f32 encodes x as a float32 tensor of rows of the inner dims
// (wire.EncodeFloat32); nil x is absent.
func (e *enc) f32(field string, x []float32, inner ...int) *workerv1.Tensor {
	t, err := wire.EncodeFloat32(x, inner...)
	if err != nil {
		e.fail(worker.ErrBadMessage, "%s %v", field, err)
	}
	return t
}

// f32Entry is f32 for an entry of a repeated field (nil: an empty
// message).
func (e *enc) f32Entry(field string, x []float32, inner ...int) *workerv1.Tensor {
	if x == nil {
		return &workerv1.Tensor{}
	}
	return e.f32(field, x, inner...)
}

// i32 encodes x as an int32 vector; nil x is absent.
func (e *enc) i32(field string, x []int32) *workerv1.Tensor {
	t, err := wire.EncodeInt32(x)
	if err != nil {
		e.fail(worker.ErrBadMessage, "%s %v", field, err)
	}
	return t
}

// dec decodes one message; its errors wrap sentinel.
type dec struct {
	what     string // "layer request"
	sentinel error  // worker.ErrBadMessage on a node, errBadReply on a client
	err      error
}

func (d *dec) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s: %s", d.sentinel, d.what, fmt.Sprintf(format, args...))
	}
}

// toInt converts a wire count to int.
func toInt[T uint32 | uint64](d *dec, field string, v T) int {
	if uint64(v) > math.MaxInt {
		d.fail("%s %d overflows int", field, v)
		return 0
	}
	return int(v)
}

func (d *dec) rank(field string, r *workerv1.Rank) worker.Rank {
	if r == nil {
		d.fail("%s: missing", field)
		return worker.Rank{}
	}
	return worker.Rank{TP: toInt(d, field+".tp", r.GetTp()), CP: toInt(d, field+".cp", r.GetCp())}
}

// f32 decodes a float32 tensor into dst's storage (wire.DecodeFloat32):
// absent gives dst[:0] (nil for a nil dst), present a non-nil slice.
func (d *dec) f32(dst []float32, t *workerv1.Tensor, field string, want ...int) []float32 {
	x, err := wire.DecodeFloat32(dst, t, want...)
	if err != nil {
		d.fail("%s: %v", field, err)
	}
	return x
}

// i32 decodes an int32 vector like f32.
func (d *dec) i32(dst []int32, t *workerv1.Tensor, field string) []int32 {
	x, err := wire.DecodeInt32(dst, t)
	if err != nil {
		d.fail("%s: %v", field, err)
	}
	return x
}

// GridRef names a grid on its nodes and the membership view it was opened
// under (workerv1.GridRef).
type GridRef struct {
	Grid string
	View uint64
}

func (r GridRef) proto() *workerv1.GridRef { return &workerv1.GridRef{Grid: r.Grid, View: r.View} }

// encodeConfig is worker.Config as a GridConfig (MemoryLimit and
// DeviceResident are each node's own business and do not travel). DType
// travels as kv_dtype (wireDType): plan.Float32 as "" (what nodes older
// than the field read as f32), plan.FP8 as "fp8"; the GPU's 16-bit types
// are refused (a device-resident node stores its backend's type). The
// policy's page size is the geometry's (plan.Policy.WithGeometry), as the
// workers use it. The offload settings (DeviceBudgetPages, Eviction,
// PrefetchPages, PrefetchCrossLayer) travel: every rank of a grid offloads
// alike.
func encodeConfig(c worker.Config) (*workerv1.GridConfig, error) {
	e := &enc{what: "grid config"}
	kv, ok := wireDType(c.DType)
	if !ok {
		e.fail(worker.ErrBadMessage, "dtype %v does not travel (grids store f32 or fp8)", c.DType)
	}
	p, err := wire.PolicyProto(c.Policy.WithGeometry(c.Geometry))
	if err != nil {
		e.fail(worker.ErrBadMessage, "%v", err)
	}
	g := &workerv1.GridConfig{
		Layers: e.u32("layers", c.Layers), QHeads: e.u32("q heads", c.QHeads), KvHeads: e.u32("kv heads", c.KVHeads),
		HeadDim: e.u32("head dim", c.HeadDim), PageSize: e.u32("page size", c.PageSize),
		Cp: e.u32("cp", c.CP), Tp: e.u32("tp", c.TP), CapacityPages: e.u32("capacity", c.Capacity),
		Policy:            p,
		Mode:              c.Mode.String(),
		DeviceBudgetPages: e.u32("device budget pages", c.DeviceBudgetPages),
		PrefetchPages:     e.u32("prefetch pages", c.PrefetchPages), PrefetchCrossLayer: c.PrefetchCrossLayer,
		KvDtype: kv,
	}
	switch c.Eviction {
	case pagestore.EvictLRU, pagestore.EvictScore:
		g.Eviction = c.Eviction.String()
	default:
		e.fail(worker.ErrBadMessage, "unknown eviction policy %d", c.Eviction)
	}
	return g, e.err
}

// Bounds of a GridConfig message's sizes, checked when it is decoded,
// before anything is sized from it: a caller of the client or worker API
// gets InvalidArgument past them (questd's own flags are narrower:
// --head-dim 1..1024). The memory a config needs is checked when its
// grid opens (memlimit.Check).
const (
	MaxGridLayers   = 1024
	MaxGridHeads    = 1024 // query heads, KV heads
	MaxGridHeadDim  = 4096
	MaxGridPageSize = 1 << 16
	MaxGridCP       = 4096
	MaxGridTP       = 1024
)

// decodeConfig is a GridConfig as a worker.Config (not validated beyond
// the bounds of its sizes).
func decodeConfig(g *workerv1.GridConfig) (worker.Config, error) {
	d := &dec{what: "grid config", sentinel: worker.ErrBadMessage}
	if g == nil || g.Policy == nil {
		return worker.Config{}, fmt.Errorf("%w: grid config: missing config or policy", worker.ErrBadMessage)
	}
	c := worker.Config{
		Layers: toInt(d, "layers", g.Layers),
		Geometry: plan.Geometry{QHeads: toInt(d, "q heads", g.QHeads), KVHeads: toInt(d, "kv heads", g.KvHeads),
			HeadDim: toInt(d, "head dim", g.HeadDim), PageSize: toInt(d, "page size", g.PageSize)},
		CP:       toInt(d, "cp", g.Cp),
		TP:       toInt(d, "tp", g.Tp),
		Capacity: toInt(d, "capacity", g.CapacityPages),
		Settings: offload.Settings{
			DeviceBudgetPages:  toInt(d, "device budget pages", g.DeviceBudgetPages),
			PrefetchPages:      toInt(d, "prefetch pages", g.PrefetchPages),
			PrefetchCrossLayer: g.PrefetchCrossLayer,
		},
	}
	for _, r := range []struct {
		field string
		v, hi int
	}{
		{"layers", c.Layers, MaxGridLayers}, {"q heads", c.QHeads, MaxGridHeads}, {"kv heads", c.KVHeads, MaxGridHeads},
		{"head dim", c.HeadDim, MaxGridHeadDim}, {"page size", c.PageSize, MaxGridPageSize},
		{"cp", c.CP, MaxGridCP}, {"tp", c.TP, MaxGridTP}, {"capacity pages", c.Capacity, plan.MaxPages},
	} {
		if r.v < 1 || r.v > r.hi {
			d.fail("%s %d: want 1..%d", r.field, r.v, r.hi)
		}
	}
	var err error
	if c.Policy, err = wire.Policy(g.Policy); err != nil {
		d.fail("%v", err)
	}
	if c.Mode, err = plan.ParseSelectMode(g.Mode); err != nil {
		d.fail("mode: %v", err)
	}
	if c.Eviction, err = pagestore.ParseEviction(g.Eviction); err != nil {
		d.fail("eviction: %v", err)
	}
	if c.DType, err = parseWireDType(g.KvDtype); err != nil {
		d.fail("%v", err)
	}
	return c, d.err
}

// wireDType is the kv_dtype of GridConfig and OpenGridReply for the
// pages' storage type dt: "" for plan.Float32 (the zero value, what a
// node older than the field reads and answers), "fp8" for plan.FP8; ok
// is false for a type that does not travel.
func wireDType(dt plan.DType) (s string, ok bool) {
	switch dt {
	case plan.Float32:
		return "", true
	case plan.FP8:
		return dt.String(), true
	}
	return "", false
}

// parseWireDType is the storage type a kv_dtype names: "" is
// plan.Float32, "fp8" plan.FP8; any other value (a type of a newer peer,
// or a GPU type) is refused, so that no grid stores another type than
// the one its coordinator asked for.
func parseWireDType(s string) (plan.DType, error) {
	switch s {
	case "":
		return plan.Float32, nil
	case plan.FP8.String():
		return plan.FP8, nil
	}
	return 0, fmt.Errorf("kv dtype %q: this node stores f32 (\"\") or fp8 pages", s)
}

func encodeLayout(e *enc, l plan.Layout) *workerv1.Layout {
	return &workerv1.Layout{Cp: e.u32("layout cp", l.CP), Tp: e.u32("layout tp", l.TP), Placement: l.Placement.String(),
		BlockPages: e.u32("layout block pages", l.BlockPages)}
}

func decodeLayout(d *dec, l *workerv1.Layout) plan.Layout {
	if l == nil {
		d.fail("no layout")
		return plan.Layout{}
	}
	p, err := plan.ParsePlacement(l.Placement)
	if err != nil {
		d.fail("layout: %v", err)
	}
	return plan.Layout{CP: toInt(d, "layout.cp", l.Cp), TP: toInt(d, "layout.tp", l.Tp), Placement: p, BlockPages: toInt(d, "layout.block_pages", l.BlockPages)}
}

// geometry is what a grid's config fixes of its tensors' shapes.
type geometry struct{ q, kv, d, s int } // heads per TP rank, head dim, page size

func geometryOf(c worker.Config) geometry {
	if c.TP < 1 {
		return geometry{}
	}
	return geometry{q: c.QHeads / c.TP, kv: c.KVHeads / c.TP, d: c.HeadDim, s: c.PageSize}
}

// encodeAppend and the encoders below are the client's; the decoders are
// the node's (requests) and the client's (replies).
func encodeAppend(ref *workerv1.GridRef, g geometry, m worker.AppendRequest) (*workerv1.AppendRequest, error) {
	e := &enc{what: "append request"}
	r := &workerv1.AppendRequest{Ref: ref, Seq: m.Seq, Rank: e.rank("rank", m.Rank), Layer: e.u32("layer", m.Layer),
		Start: e.u64("start", m.Start), Tokens: e.u64("tokens", m.Tokens),
		K: e.f32("k", m.K, g.kv, g.d), V: e.f32("v", m.V, g.kv, g.d), MirrorK: e.f32("mirror_k", m.MirrorK, g.kv, g.d)}
	return r, e.err
}

func decodeAppend(g geometry, r *workerv1.AppendRequest) (worker.AppendRequest, error) {
	d := &dec{what: "append request", sentinel: worker.ErrBadMessage}
	m := worker.AppendRequest{Seq: r.Seq, Rank: d.rank("rank", r.Rank), Layer: toInt(d, "layer", r.Layer),
		Start: toInt(d, "start", r.Start), Tokens: toInt(d, "tokens", r.Tokens)}
	m.K = d.f32(nil, r.K, "k", anyDim, g.kv, g.d)
	m.V = d.f32(nil, r.V, "v", anyDim, g.kv, g.d)
	m.MirrorK = d.f32(nil, r.MirrorK, "mirror_k", m.Tokens, g.kv, g.d)
	return m, d.err
}

func encodeCheck(ref *workerv1.GridRef, m worker.CheckRequest) (*workerv1.CheckRequest, error) {
	e := &enc{what: "check request"}
	r := &workerv1.CheckRequest{Ref: ref, Seq: m.Seq, Layer: e.u32("layer", m.Layer), Len: e.u64("len", m.Len),
		Append: e.u64("append", m.Append), Drop: e.u64("drop", m.Drop)}
	return r, e.err
}

func decodeCheck(r *workerv1.CheckRequest) (worker.CheckRequest, error) {
	d := &dec{what: "check request", sentinel: worker.ErrBadMessage}
	m := worker.CheckRequest{Seq: r.Seq, Layer: toInt(d, "layer", r.Layer), Len: toInt(d, "len", r.Len),
		Append: toInt(d, "append", r.Append), Drop: toInt(d, "drop", r.Drop)}
	return m, d.err
}

func encodeRollback(ref *workerv1.GridRef, g geometry, m worker.RollbackRequest) (*workerv1.RollbackRequest, error) {
	e := &enc{what: "rollback request"}
	r := &workerv1.RollbackRequest{Ref: ref, Seq: m.Seq, Rank: e.rank("rank", m.Rank), Len: e.u64("len", m.Len), Drop: e.u64("drop", m.Drop)}
	for l, t := range m.Tail {
		r.Tail = append(r.Tail, e.f32Entry(fmt.Sprintf("tail[%d]", l), t, 2, g.d))
	}
	for _, n := range m.Lens {
		r.Lens = append(r.Lens, e.u32("lens", n))
	}
	return r, e.err
}

func decodeRollback(g geometry, r *workerv1.RollbackRequest) (worker.RollbackRequest, error) {
	d := &dec{what: "rollback request", sentinel: worker.ErrBadMessage}
	m := worker.RollbackRequest{Seq: r.Seq, Rank: d.rank("rank", r.Rank), Len: toInt(d, "len", r.Len), Drop: toInt(d, "drop", r.Drop)}
	m.Tail = decodeTail(d, nil, r.Tail, g)
	for _, n := range r.GetLens() {
		m.Lens = append(m.Lens, toInt(d, "lens", n))
	}
	return m, d.err
}

// decodeTail decodes summary records [kv][2][d] per layer (nil when
// none).
func decodeTail(d *dec, dst [][]float32, ts []*workerv1.Tensor, g geometry) [][]float32 {
	if len(ts) == 0 {
		return nil
	}
	out := dst[:0]
	for l, t := range ts {
		out = append(out, d.f32(nil, t, fmt.Sprintf("tail[%d]", l), g.kv, 2, g.d))
	}
	return out
}

func encodeRollbackReply(g geometry, m worker.RollbackReply) (*workerv1.RollbackReply, error) {
	e := &enc{what: "rollback reply"}
	r := &workerv1.RollbackReply{}
	for l, t := range m.Tail {
		r.Tail = append(r.Tail, e.f32Entry(fmt.Sprintf("tail[%d]", l), t, 2, g.d))
	}
	return r, e.err
}

func decodeRollbackReply(g geometry, r *workerv1.RollbackReply) (worker.RollbackReply, error) {
	d := &dec{what: "rollback reply", sentinel: errBadReply}
	return worker.RollbackReply{Tail: decodeTail(d, nil, r.Tail, g)}, d.err
}

func encodeBegin(ref *workerv1.GridRef, m worker.BeginRequest) (*workerv1.BeginRequest, error) {
	e := &enc{what: "begin request"}
	r := &workerv1.BeginRequest{Ref: ref, Step: m.Step, Layer: e.u32("layer", m.Layer), Phased: m.Phased,
		Diagnostics: m.Diagnostics, ForceDense: m.ForceDense, Seqs: make([]*workerv1.StepSeq, len(m.Seqs))}
	for i, s := range m.Seqs {
		f := fmt.Sprintf("seqs[%d].", i)
		r.Seqs[i] = &workerv1.StepSeq{Seq: s.Seq, Len: e.u64(f+"len", s.Len), New: s.New, Budget: e.u32(f+"budget", s.Budget), DenseLayers: e.u32(f+"dense layers", s.DenseLayers)}
	}
	return r, e.err
}

func decodeBegin(r *workerv1.BeginRequest) (worker.BeginRequest, error) {
	d := &dec{what: "begin request", sentinel: worker.ErrBadMessage}
	m := worker.BeginRequest{Step: r.Step, Layer: toInt(d, "layer", r.Layer), Phased: r.Phased, Diagnostics: r.Diagnostics,
		ForceDense: r.ForceDense, Seqs: make([]worker.StepSeq, len(r.Seqs))}
	for i, s := range r.Seqs {
		f := fmt.Sprintf("seqs[%d].", i)
		m.Seqs[i] = worker.StepSeq{Seq: s.GetSeq(), Len: toInt(d, f+"len", s.GetLen()), New: s.GetNew(), Budget: toInt(d, f+"budget", s.GetBudget()), DenseLayers: toInt(d, f+"dense layers", s.GetDenseLayers())}
	}
	return m, d.err
}

func encodeEnd(ref *workerv1.GridRef, m worker.EndRequest) (*workerv1.EndRequest, error) {
	e := &enc{what: "end request"}
	r := &workerv1.EndRequest{Ref: ref, Step: m.Step, Failed: m.Failed}
	for _, l := range m.Layers {
		r.Layers = append(r.Layers, e.u32("layer", l))
	}
	return r, e.err
}

// decodeEnd decodes an end request, dropping the layers outside the
// grid's (no tags to forget there: an EndStep must not be refused, and a
// transport keeps every tag it forgets).
func decodeEnd(r *workerv1.EndRequest, layers int) worker.EndRequest {
	m := worker.EndRequest{Step: r.Step, Failed: r.Failed}
	for _, l := range r.Layers {
		if uint64(l) < uint64(layers) && !slices.Contains(m.Layers, int(l)) {
			m.Layers = append(m.Layers, int(l))
		}
	}
	return m
}

func encodeLayer(ref *workerv1.GridRef, g geometry, m worker.LayerRequest) (*workerv1.LayerRequest, error) {
	e := &enc{what: "layer request"}
	r := &workerv1.LayerRequest{Ref: ref, Step: m.Step, Layer: e.u32("layer", m.Layer), Ranks: make([]*workerv1.RankInput, len(m.Ranks))}
	for i, in := range m.Ranks {
		f := fmt.Sprintf("ranks[%d].", i)
		r.Ranks[i] = &workerv1.RankInput{Rank: e.rank(f+"rank", in.Rank), Q: e.f32(f+"q", in.Q, g.q, g.d),
			K: e.f32(f+"k", in.K, g.kv, g.d), V: e.f32(f+"v", in.V, g.kv, g.d), MirrorK: e.f32(f+"mirror_k", in.MirrorK, g.kv, g.d)}
	}
	return r, e.err
}

// decodeLayer decodes a layer request; seqs and fresh are the open step's
// sequences and new tokens when known (else anyDim), the leading dims of
// q and mirror_k.
func decodeLayer(g geometry, r *workerv1.LayerRequest, seqs, fresh int) (worker.LayerRequest, error) {
	d := &dec{what: "layer request", sentinel: worker.ErrBadMessage}
	m := worker.LayerRequest{Step: r.Step, Layer: toInt(d, "layer", r.Layer), Ranks: make([]worker.RankInput, len(r.Ranks))}
	for i, in := range r.Ranks {
		f := fmt.Sprintf("ranks[%d].", i)
		m.Ranks[i] = worker.RankInput{Rank: d.rank(f+"rank", in.GetRank()),
			Q: d.f32(nil, in.GetQ(), f+"q", seqs, g.q, g.d), K: d.f32(nil, in.GetK(), f+"k", anyDim, g.kv, g.d),
			V: d.f32(nil, in.GetV(), f+"v", anyDim, g.kv, g.d), MirrorK: d.f32(nil, in.GetMirrorK(), f+"mirror_k", fresh, g.kv, g.d)}
	}
	return m, d.err
}

func encodeLayerReply(g geometry, m *worker.LayerReply) (*workerv1.LayerReply, error) {
	e := &enc{what: "layer reply"}
	r := &workerv1.LayerReply{Ranks: make([]*workerv1.RankOutput, len(m.Ranks))}
	for i, o := range m.Ranks {
		f := fmt.Sprintf("ranks[%d].", i)
		t := o.Time
		out := &workerv1.RankOutput{Rank: e.rank(f+"rank", o.Rank), Appended: e.u64(f+"appended", o.Appended),
			O: e.f32(f+"o", o.O, g.q, g.d), Lse: e.f32(f+"lse", o.LSE, g.q),
			Time: &workerv1.Times{ScoreNs: int64(t.Score), TopkNs: int64(t.TopK), SelectNs: int64(t.Select),
				AttendNs: int64(t.Attend), MergeNs: int64(t.Merge), FusedNs: int64(t.Fused)}}
		if dg := o.Diag; dg.Rows > 0 || len(dg.Indptr) > 0 || len(dg.Pages) > 0 || dg.Scores != nil {
			out.Diag = &workerv1.RankDiag{Rows: e.u32(f+"diag.rows", dg.Rows), Indptr: e.i32(f+"diag.indptr", dg.Indptr),
				Pages: e.i32(f+"diag.pages", dg.Pages), Scored: dg.Scores != nil}
			for s, sc := range dg.Scores {
				t := e.f32Entry(fmt.Sprintf("%sdiag.scores[%d]", f, s), sc)
				if sc != nil && dg.Rows > 0 && len(sc)%dg.Rows == 0 {
					t.Shape = []uint32{e.u32(f+"diag.rows", dg.Rows), e.u32(f+"diag.scores", len(sc)/dg.Rows)}
				}
				out.Diag.Scores = append(out.Diag.Scores, t)
			}
		}
		r.Ranks[i] = out
	}
	return r, e.err
}

// decodeLayerReply fills rep from r, reusing rep's slices. Every rank's
// Rank and Appended are set before any tensor is decoded, so that they
// survive a malformed tensor.
func decodeLayerReply(g geometry, r *workerv1.LayerReply, rep *worker.LayerReply) error {
	d := &dec{what: "layer reply", sentinel: errBadReply}
	rep.Ranks = resizeOutputs(rep.Ranks, len(r.Ranks))
	for i, o := range r.Ranks {
		out := &rep.Ranks[i]
		out.Rank, out.Appended = d.rank(fmt.Sprintf("ranks[%d].rank", i), o.GetRank()), toInt(d, "appended", o.GetAppended())
	}
	for i, o := range r.Ranks {
		f := fmt.Sprintf("ranks[%d].", i)
		out := &rep.Ranks[i]
		out.O = d.f32(out.O, o.GetO(), f+"o", anyDim, g.q, g.d)
		out.LSE = d.f32(out.LSE, o.GetLse(), f+"lse", anyDim, g.q)
		t := o.GetTime()
		out.Time = worker.Times{Score: time.Duration(t.GetScoreNs()), TopK: time.Duration(t.GetTopkNs()), Select: time.Duration(t.GetSelectNs()),
			Attend: time.Duration(t.GetAttendNs()), Merge: time.Duration(t.GetMergeNs()), Fused: time.Duration(t.GetFusedNs())}
		dg, od := &out.Diag, o.GetDiag()
		dg.Rows = toInt(d, f+"diag.rows", od.GetRows())
		dg.Indptr = d.i32(dg.Indptr, od.GetIndptr(), f+"diag.indptr")
		dg.Pages = d.i32(dg.Pages, od.GetPages(), f+"diag.pages")
		if !od.GetScored() {
			dg.Scores = nil
			continue
		}
		sc := dg.Scores[:0]
		if sc == nil {
			sc = [][]float32{}
		}
		for s, t := range od.GetScores() {
			var buf []float32
			if s < cap(dg.Scores) {
				buf = dg.Scores[:s+1][s]
			}
			var want []int
			if dg.Rows > 0 {
				want = []int{dg.Rows, anyDim}
			}
			sc = append(sc, d.f32(buf, t, fmt.Sprintf("%sdiag.scores[%d]", f, s), want...))
		}
		dg.Scores = sc
	}
	return d.err
}

func resizeOutputs(s []worker.RankOutput, n int) []worker.RankOutput {
	if cap(s) < n {
		s = append(s[:cap(s)], make([]worker.RankOutput, n-cap(s))...)
	}
	return s[:n]
}

func encodeKeys(ref *workerv1.GridRef, m worker.KeysRequest) (*workerv1.KeysRequest, error) {
	e := &enc{what: "keys request"}
	r := &workerv1.KeysRequest{Ref: ref, Seq: m.Seq, Rank: e.rank("rank", m.Rank), Layer: e.u32("layer", m.Layer),
		From: e.u64("from", m.From), Count: e.u64("count", m.Count)}
	return r, e.err
}

func decodeKeys(r *workerv1.KeysRequest) (worker.KeysRequest, error) {
	d := &dec{what: "keys request", sentinel: worker.ErrBadMessage}
	m := worker.KeysRequest{Seq: r.GetSeq(), Rank: d.rank("rank", r.GetRank()), Layer: toInt(d, "layer", r.GetLayer()),
		From: toInt(d, "from", r.GetFrom()), Count: toInt(d, "count", r.GetCount())}
	return m, d.err
}

func encodeKeysReply(g geometry, m *worker.KeysReply) (*workerv1.KeysReply, error) {
	e := &enc{what: "keys reply"}
	return &workerv1.KeysReply{K: e.f32("k", m.K, g.kv, g.s, g.d)}, e.err
}

func decodeKeysReply(g geometry, r *workerv1.KeysReply, count int, rep *worker.KeysReply) error {
	d := &dec{what: "keys reply", sentinel: errBadReply}
	rep.K = d.f32(rep.K, r.GetK(), "k", count, g.kv, g.s, g.d)
	return d.err
}
