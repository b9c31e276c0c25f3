package plots

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/questrt/questrt/eval"
)

// Kind names the command whose JSON lines a figure is drawn from.
type Kind string

// The kinds of input.
const (
	// KindAuto takes the kind from the first line.
	KindAuto Kind = "auto"
	// KindPasskey is `questctl eval passkey --json`.
	KindPasskey Kind = "passkey"
	// KindAttention is `questctl bench attention --json`.
	KindAttention Kind = "attention"
	// KindCollective is `questctl bench collective --json` (the
	// configurations' lines and the size sweep's).
	KindCollective Kind = "collective"
)

// command is the questctl command whose lines are of kind k.
func (k Kind) command() string {
	switch k {
	case KindPasskey:
		return "eval passkey"
	case KindAttention:
		return "bench attention"
	case KindCollective:
		return "bench collective"
	}
	return string(k)
}

// MaxPanels is the most panels a figure has in a row or a column.
const MaxPanels = 8

// ErrNoRecords is returned for an input without a JSON line.
var ErrNoRecords = errors.New("no JSON lines")

// ParseKind reads auto, passkey or attention.
func ParseKind(s string) (Kind, error) {
	switch k := Kind(s); k {
	case KindAuto, KindPasskey, KindAttention, KindCollective:
		return k, nil
	}
	return "", fmt.Errorf("unknown kind %q (want passkey, attention, collective or auto)", s)
}

// AttentionRow is one line of `questctl bench attention --json`, from the
// CPU benchmark (bench.AttentionResult) or the CUDA one. Timings absent
// from a line are nil.
type AttentionRow struct {
	Backend      string `json:"backend"`
	DType        string `json:"dtype"`
	Context      int    `json:"context"`
	Batch        int    `json:"batch"`
	Budget       int    `json:"budget"`
	PageSize     int    `json:"page_size"`
	QHeads       int    `json:"q_heads"`
	KVHeads      int    `json:"kv_heads"`
	HeadDim      int    `json:"head_dim"`
	Iters        int    `json:"iters"`
	BudgetCapped bool   `json:"budget_capped"`
	// Median step and phase times in microseconds.
	DenseUS  *float64 `json:"dense_us"`
	QuestUS  *float64 `json:"quest_us"`
	PhasedUS *float64 `json:"phased_us"`
	ScoreUS  *float64 `json:"score_us"`
	TopKUS   *float64 `json:"topk_us"`
	AttendUS *float64 `json:"attend_us"`
}

// Data holds the records read from one or more inputs, all of one kind.
type Data struct {
	// Kind is KindAuto until the first line is read, then the kind of
	// every line. Set it before reading to require one kind.
	Kind       Kind
	Passkey    []eval.Record
	Attention  []AttentionRow
	Collective []CollectiveRow
	Sweep      []SweepRow
}

// maxLine is the longest JSON line Read takes (a passkey record of a
// large model carries per-head arrays for every layer).
const maxLine = 64 << 20

// Read adds the JSON lines of r to d. Blank lines are skipped; a line
// that is not a JSON object of the expected kind is an error naming its
// line number. An input without any JSON line is ErrNoRecords.
func (d *Data) Read(r io.Reader) error {
	if d.Kind == "" {
		d.Kind = KindAuto
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	n, lines := 0, 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		lines++
		if err := d.add(line); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("line %d: longer than %d MiB", n+1, maxLine>>20)
		}
		return err
	}
	if lines == 0 {
		return ErrNoRecords
	}
	return nil
}

func (d *Data) add(line []byte) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(line, &keys); err != nil {
		return fmt.Errorf("not a JSON object: %w", err)
	}
	has := func(ks ...string) bool {
		for _, k := range ks {
			if _, ok := keys[k]; !ok {
				return false
			}
		}
		return true
	}
	var kind Kind
	var lineKind string
	if k, ok := keys["kind"]; ok {
		_ = json.Unmarshal(k, &lineKind)
	}
	switch {
	case has("selector", "accuracy"):
		kind = KindPasskey
	case has("context", "dense_us"):
		kind = KindAttention
	case lineKind == "collective" || lineKind == "allgather_sweep":
		kind = KindCollective
	default:
		return errors.New("neither an eval passkey line (with selector and accuracy), a bench attention line (with context and dense_us) nor a bench collective line (kind collective or allgather_sweep)")
	}
	if d.Kind != KindAuto && d.Kind != kind {
		return fmt.Errorf("%s line where %s lines are wanted", kind.command(), d.Kind.command())
	}
	d.Kind = kind
	if kind == KindCollective {
		return d.addCollective(lineKind, line)
	}
	if kind == KindPasskey {
		if !has("length", "budget") {
			return errors.New("passkey line without length or budget")
		}
		var rec eval.Record
		if err := json.Unmarshal(line, &rec); err != nil {
			return fmt.Errorf("passkey line: %w", err)
		}
		switch {
		case rec.Length <= 0:
			return fmt.Errorf("length %d: want a positive length", rec.Length)
		case rec.Selector == "":
			return errors.New("empty selector")
		case rec.Budget < 0 || rec.Budget == 0 && rec.Selector != "dense" || rec.Budget > 0 && rec.Selector == "dense":
			return fmt.Errorf("selector %s with budget %d (want budget 0 for dense only)", rec.Selector, rec.Budget)
		case !(rec.Accuracy >= 0 && rec.Accuracy <= 1) || !(rec.DenseAccuracy >= 0 && rec.DenseAccuracy <= 1):
			return fmt.Errorf("accuracy %v, dense_accuracy %v: want values in [0, 1]", rec.Accuracy, rec.DenseAccuracy)
		}
		d.Passkey = append(d.Passkey, rec)
		return nil
	}
	var row AttentionRow
	if err := json.Unmarshal(line, &row); err != nil {
		return fmt.Errorf("attention line: %w", err)
	}
	if row.Context <= 0 || row.Budget < 0 || row.Batch < 0 {
		return fmt.Errorf("context %d, budget %d, batch %d: want a positive context and no negative budget or batch", row.Context, row.Budget, row.Batch)
	}
	for _, p := range []*float64{row.DenseUS, row.QuestUS, row.PhasedUS, row.ScoreUS, row.TopKUS, row.AttendUS} {
		if p != nil && (math.IsNaN(*p) || math.IsInf(*p, 0)) {
			return errors.New("a timing that is not a finite number")
		}
	}
	d.Attention = append(d.Attention, row)
	return nil
}

// addCollective adds a bench collective line.
func (d *Data) addCollective(kind string, line []byte) error {
	finite := func(xs ...float64) bool {
		for _, x := range xs {
			if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
				return false
			}
		}
		return true
	}
	if kind == "allgather_sweep" {
		var r SweepRow
		if err := json.Unmarshal(line, &r); err != nil {
			return fmt.Errorf("allgather_sweep line: %w", err)
		}
		if r.Bytes <= 0 || r.Shards <= 0 || !finite(r.P50, r.P99, r.BusBW) {
			return fmt.Errorf("allgather_sweep line: bytes %d, ranks %d, p50 %v, p99 %v, busbw %v: want positive sizes and finite, non-negative figures", r.Bytes, r.Shards, r.P50, r.P99, r.BusBW)
		}
		d.Sweep = append(d.Sweep, r)
		return nil
	}
	var r CollectiveRow
	if err := json.Unmarshal(line, &r); err != nil {
		return fmt.Errorf("collective line: %w", err)
	}
	if r.Shards <= 0 || r.Batch <= 0 || !finite(r.SelectP50, r.SelectP99, r.BaselineP50, r.MergeP50) {
		return fmt.Errorf("collective line: ranks %d, batch %d: want positive ranks and batch and finite, non-negative timings", r.Shards, r.Batch)
	}
	d.Collective = append(d.Collective, r)
	return nil
}

// Figure builds the figure of d's kind.
func (d *Data) Figure() (*Figure, error) {
	switch d.Kind {
	case KindCollective:
		return Collective(d.Sweep, d.Collective)
	case KindPasskey:
		return Passkey(d.Passkey)
	case KindAttention:
		return Attention(d.Attention)
	}
	return nil, ErrNoRecords
}
